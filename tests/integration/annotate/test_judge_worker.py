"""The judge worker with a real vLLM (CPU build) engine on the tiny model, against a real redis-server:
it scores rollouts the tiny policy generated (in that same engine: the tiny config's judge is the
policy at its initial weights), its greedy scores equal transformers' argmax over the allowed digits,
a rollout judged again gets the same seeded score, and output that does not parse is each rollout's
error annotation (dead-lettered), with the worker still running.

    pytest tests/integration/annotate/test_judge_worker.py
"""

from __future__ import annotations

import functools
import string

import numpy as np
import pytest
import torch

from streamrl.annotate.judge import render
from streamrl.config.files import load_config
from streamrl.config.schema import JudgeScore
from streamrl.core.messages import Rollout, decode, encode
from streamrl.models.tiny import resolve_model_path
from workers.judge import JudgeWorker

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]
PROMPTS = ["digits:", "lower:", "upper:", "vowels:"]
REPEATED = ["e" * 16, "g" * 16, "P" * 16, "V" * 16, "a" * 16]
"""Completions of one repeated character: where this random judge's greedy digit is not 0 (e/g/P/V: 9/4/7/6),
so the greedy check compares more than the 0 that most random completions get."""


def judge_config(config, tmp_path):
    cfg = load_config("configs/tiny-judge-cpu.yaml", [])
    cfg = cfg.model_copy(update={"run": config.run, "broker": config.broker})
    path = resolve_model_path(cfg.model, tmp_path / "models", cfg.run.seed)
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": str(path)})})


def rollout(i: int, prompt: str, ids: list[int], lps: list[float], tok) -> Rollout:
    return Rollout(
        rollout_id=f"g{i}:0:n",
        group_id=f"g{i}",
        sample=0,
        group_size=1,
        prompt_ids=np.array(tok.encode(prompt)),
        completion_ids=np.array(ids),
        logprobs=np.array(lps, np.float32),
        version=0,
        prompt_text=prompt,
        text=tok.decode(ids, skip_special_tokens=True),
    )


async def policy_rollouts(worker: JudgeWorker, n: int) -> list[Rollout]:
    """`n` charclass rollouts sampled from the tiny policy in the judge's engine (the same weights),
    then one per REPEATED text."""
    engine = worker.engine.engine
    tok = engine.get_tokenizer()
    out = []
    for i in range(n):
        prompt = PROMPTS[i % len(PROMPTS)]
        ids, lps = [], []
        params = engine.sampling_params(seed=i, temperature=1.0, max_tokens=16)
        async for d in engine.stream(tok.encode(prompt), params, f"policy-{i}"):
            ids += d.token_ids
            lps += d.logprobs
        out.append(rollout(i, prompt, ids, lps, tok))
    for i, text in enumerate(REPEATED, start=n):
        ids = tok.encode(text, add_special_tokens=False)
        out.append(rollout(i, "lower:", ids, [-1.0] * len(ids), tok))
    return out


@functools.cache
def hf_model(model_path: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path), AutoModelForCausalLM.from_pretrained(model_path).eval()


def argmax_digit(model_path: str, text: str) -> int:
    """The independent check: transformers' next-token argmax over the ten digits."""
    tok, model = hf_model(model_path)
    digits = [tok.convert_tokens_to_ids(d) for d in string.digits]
    with torch.no_grad():
        logits = model(tok(text, return_tensors="pt").input_ids).logits[0, -1]
    return int(torch.argmax(logits[digits]))


async def judged(worker: JudgeWorker, rollouts: list[Rollout]) -> dict:
    for r in rollouts:
        await worker.broker.add(worker.keys.rollouts, encode(r))
    while await worker.step():
        pass
    return {a.rollout_id: a for a in (decode(e.data) for e in await worker.broker.read(worker.keys.annotations))}


async def test_judge_scores_policy_rollouts(config, broker, tmp_path):
    cfg = judge_config(config, tmp_path)
    cfg.judge.temperature = 0.0  # greedy first: comparable with transformers' argmax
    worker = JudgeWorker(cfg, broker, "judge-0")
    await worker.start()
    try:
        rollouts = await policy_rollouts(worker, 12)
        got = await judged(worker, rollouts)
        assert set(got) == {r.rollout_id for r in rollouts}
        assert all(a.error == "" and a.key == "judge" for a in got.values())
        for r in rollouts:
            prompt = render(cfg.judge.template, r.prompt_text, r.text, r.meta)
            assert got[r.rollout_id].value == argmax_digit(cfg.model.path, prompt), r.text
            assert got[r.rollout_id].text.strip() == str(int(got[r.rollout_id].value))  # its reply, for samples.jsonl
        assert len({a.value for a in got.values()}) >= 3  # the check saw more than one digit

        # Sampled (temperature 0.1) and seeded per rollout: a rollout judged again scores the same.
        cfg.judge.temperature = 0.1
        await broker.client.delete(worker.keys.annotations)
        first = await judged(worker, rollouts)
        await broker.client.delete(worker.keys.annotations)
        again = await judged(worker, rollouts)
        assert {k: a.value for k, a in first.items()} == {k: a.value for k, a in again.items()}
        assert all(0 <= a.value <= 9 and a.value == int(a.value) for a in first.values())

        # Output the regex cannot read: every rollout's annotation error, dead-lettered; the worker runs on.
        cfg.judge.score = JudgeScore(regex=r"Score=(\d)")
        await broker.client.delete(worker.keys.annotations)
        bad = await judged(worker, rollouts[:4])
        assert all("does not match judge.score.regex" in a.error for a in bad.values())
        assert all(a.text.strip().isdigit() for a in bad.values())  # the reply that did not parse is kept too
        assert len(await broker.read(worker.keys.deadletter)) == 4
        assert worker.stats["judge_errors"] == 4
        info = {g["name"]: g for g in await broker.group_info(worker.keys.rollouts)}
        assert info["judge"]["pending"] == 0
    finally:
        await worker.close()
