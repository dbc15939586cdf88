"""Seeded requests whose prompts together exceed one step's token budget, on one real vLLM CPU
engine that runs at most 4 of them at once (generator.max_num_seqs); prints the number of tokens each
request produced and the engine's max_num_seqs as JSON (run by test_vllm_long_prompts.py). Then the
same seeded requests under generator.detokenize=end and =incremental: their tokens, log-probs and
texts, and how many deltas carried text; and how its EngineCore was started.

    python tests/programs/long_prompts_script.py MODEL_DIR
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
from pathlib import Path


def forked_children(marker: str) -> int:
    """Child processes holding this process's open file `marker`: forked ones (a spawned child, such
    as a spawned EngineCore, starts with only the descriptors multiprocessing hands it)."""
    pids = Path(f"/proc/self/task/{os.getpid()}/children").read_text().split()
    held = 0
    for pid in pids:
        fds = Path(f"/proc/{pid}/fd")
        held += any(os.readlink(fd) == marker for fd in fds.iterdir() if fd.is_symlink())
    return held


async def main(model_dir: str) -> dict:
    from streamrl.config.schema import GeneratorConfig
    from streamrl.generate.vllm_engine import VLLMEngine

    gen = GeneratorConfig(max_model_len=1024, max_tokens=8, max_num_seqs=4)
    engine = VLLMEngine(model_dir, gen, dtype="float32", seed=0)
    marker = tempfile.NamedTemporaryFile(prefix="streamrl-fork-marker-")
    sigterms = []  # as a worker's: a forked EngineCore's own SIGTERM must not reach this loop
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: sigterms.append(1))
    await engine.start()
    tokenizer_at_start = engine.tokenizer is not None
    started = {"start_method": engine.start_method, "forked_children": forked_children(marker.name)}

    async def one(i: int) -> int:
        prompt = [4 + (i * 7 + k) % 90 for k in range(700)]  # 8 x 700 tokens > the 2048-token step budget
        n = 0
        async for delta in engine.stream(prompt, engine.sampling_params(seed=100 + i), f"req-{i}"):
            n += len(delta.token_ids)
        return n

    async def texts(mode: str) -> list[dict]:
        gen.detokenize = mode
        out = []
        for i in range(3):
            ids, lps, parts = [], [], []
            async for d in engine.stream([4 + k for k in range(20)], engine.sampling_params(seed=7 + i), f"{mode}-{i}"):
                ids += d.token_ids
                lps += d.logprobs
                parts.append(d.text)
            out.append({"ids": ids, "logprobs": lps, "text": "".join(parts), "deltas_with_text": sum(map(bool, parts))})
        return out

    try:
        tokens = list(await asyncio.gather(*(one(i) for i in range(8))))
        out = {
            "tokens": tokens,
            "tokenizer_at_start": tokenizer_at_start,
            **started,
            "max_num_seqs": engine.llm.vllm_config.scheduler_config.max_num_seqs,
            "end": await texts("end"),
            "incremental": await texts("incremental"),
        }
    finally:
        engine.shutdown()
    await asyncio.sleep(0.5)
    return {**out, "sigterms_seen": len(sigterms)}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1]))))
