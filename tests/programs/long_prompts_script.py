"""Seeded requests whose prompts together exceed one step's token budget, on one real vLLM CPU
engine that runs at most 4 of them at once (generator.max_num_seqs); prints the number of tokens each
request produced and the engine's max_num_seqs as JSON (run by test_vllm_long_prompts.py). Then the
same seeded requests under generator.detokenize=end and =incremental: their tokens, log-probs and
texts, and how many deltas carried text.

    python tests/programs/long_prompts_script.py MODEL_DIR
"""

from __future__ import annotations

import asyncio
import json
import sys


async def main(model_dir: str) -> dict:
    from streamrl.config.schema import GeneratorConfig
    from streamrl.generate.vllm_engine import VLLMEngine

    gen = GeneratorConfig(max_model_len=1024, max_tokens=8, max_num_seqs=4)
    engine = VLLMEngine(model_dir, gen, dtype="float32", seed=0)
    await engine.start()
    tokenizer_at_start = engine.tokenizer is not None

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
        return {
            "tokens": tokens,
            "tokenizer_at_start": tokenizer_at_start,
            "max_num_seqs": engine.llm.vllm_config.scheduler_config.max_num_seqs,
            "end": await texts("end"),
            "incremental": await texts("incremental"),
        }
    finally:
        engine.shutdown()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1]))))
