"""A parent that ran a multi-threaded torch op (so GNU OpenMP's thread pool exists), then starts a vLLM
engine with generator.engine_start_method=auto: the start that deadlocked for ever in the forked
EngineCore's first OpenMP region (issue 46). Prints how it started and one request's tokens as JSON
(run by tests/integration/generate/test_engine_start_openmp.py).

    python tests/programs/openmp_fork_script.py MODEL_DIR
"""

from __future__ import annotations

import asyncio
import json
import os
import sys


async def main(model_dir: str) -> dict:
    import torch

    torch.set_num_threads(2)
    (torch.ones(4_000_000) * 2).sum()  # large enough for a parallel region: the pool's threads now run
    threads_after_op = len(os.listdir("/proc/self/task"))
    from streamrl.config.schema import GeneratorConfig
    from streamrl.generate.vllm_engine import VLLMEngine

    gen = GeneratorConfig(max_model_len=128, max_tokens=4, engine_start_method="auto")
    engine = VLLMEngine(model_dir, gen, dtype="float32", seed=0)
    await engine.start()
    tokens = 0
    async for delta in engine.stream([1, 2, 3], engine.sampling_params(seed=1), "req-0"):
        tokens += len(delta.token_ids)
    (torch.ones(4_000_000) * 2).sum()  # the parent's own OpenMP still works after the release
    engine.shutdown()
    return {
        "start_method": engine.start_method,
        "openmp_threads_released": engine.openmp_threads_released,
        "threads_after_op": threads_after_op,
        "tokens": tokens,
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1]))), flush=True)
