"""How long vLLM takes to start on the tiny model, and its first 16-token request.

    python -m bench.engine_start                                   # the generator's settings
    python -m bench.engine_start --set generator.cpu_worker_in_engine=false

Prints one JSON object: engine_start_s (VLLMEngine.start()), first_request_s, shutdown_s, and the
/dev/shm/psm_* segments that exist while the engine runs.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import time

from streamrl.config.files import load_config
from streamrl.generate.vllm_engine import VLLMEngine
from streamrl.models.tiny import resolve_model


async def measure(overrides: list[str]) -> dict:
    cfg = resolve_model(load_config(None, overrides))
    engine = VLLMEngine(cfg.model.path, cfg.generator, cfg.model.dtype, cfg.run.seed)
    t0 = time.monotonic()
    await engine.start()
    t1 = time.monotonic()
    tokens = 0
    async for delta in engine.stream([1, 2, 3], engine.sampling_params(seed=1), "bench-1"):
        tokens += len(delta.token_ids)
    t2 = time.monotonic()
    shm = sorted(os.path.basename(p) for p in glob.glob("/dev/shm/psm_*"))
    t3 = time.monotonic()
    engine.shutdown()
    t4 = time.monotonic()
    return {
        "engine_start_s": round(t1 - t0, 2),
        "first_request_s": round(t2 - t1, 2),
        "shutdown_s": round(t4 - t3, 2),
        "tokens": tokens,
        "psm_segments_while_running": shm,
        "overrides": overrides,
    }


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--set", dest="overrides", action="append", default=[])
    print(json.dumps(asyncio.run(measure(p.parse_args().overrides))))
