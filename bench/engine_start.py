"""How long vLLM takes to start on the tiny model, and its first 16-token request.

    python -m bench.engine_start                                   # the generator's settings
    python -m bench.engine_start --set generator.cpu_worker_in_engine=false
    python -m bench.engine_start --torch-op-first     # a multi-threaded torch op first (OpenMP's pool runs)
    python -m bench.engine_start --torch-op-first --set generator.engine_start_method=spawn
    python -m bench.engine_start --config configs/qwen3-0.6b-gpu.yaml --set model.path=runs/models/qwen3-0.6b-random

Prints one JSON object: engine_start_s (VLLMEngine.start()), first_request_s, shutdown_s, the
/dev/shm/psm_* segments that exist while the engine runs, how the EngineCore started (start_method)
and the OpenMP threads released before its fork. `--torch-op-first`: the start after a torch op on
2 threads, as in a process that built or loaded a model first (`streamrl bench weights`): the fork
that deadlocked there before issue 46's fix.
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


async def measure(overrides: list[str], torch_op_first: bool = False, config: str | None = None) -> dict:
    cfg = resolve_model(load_config(config, overrides))
    if torch_op_first:
        import torch

        torch.set_num_threads(max(2, torch.get_num_threads()))
        (torch.ones(4_000_000) * 2).sum()  # a parallel region: GNU OpenMP's pool threads now run
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
        "start_method": engine.start_method,
        "openmp_threads_released": engine.openmp_threads_released,
        "torch_op_first": torch_op_first,
        "psm_segments_while_running": shm,
        "overrides": overrides,
    }


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--config", help="a job config whose generator and model settings to start with (default: the defaults)"
    )
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--torch-op-first", action="store_true", help="run a torch op on 2 threads before the start")
    args = p.parse_args()
    print(json.dumps(asyncio.run(measure(args.overrides, args.torch_op_first, args.config))))
