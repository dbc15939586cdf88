"""A trainer Batch of one group whose rollouts have given (prompt, completion) lengths: random
token ids, behaviour log-probs and advantages from one seeded generator (the trainer tests' input),
and the check that two ways of running one train step gave the same step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streamrl.core.batch import Batch
from streamrl.core.messages import Rollout


def shaped_batch(vocab: int, shapes: list[tuple[int, int]], seed: int, advantages: np.ndarray | None = None) -> Batch:
    """`advantages` None: uniform in [-1, 1), drawn after the rollouts."""
    rng = np.random.default_rng(seed)
    rows = len(shapes)
    rollouts = [
        Rollout(
            rollout_id=f"g0:{i}",
            group_id="g0",
            sample=i,
            group_size=rows,
            prompt_ids=rng.integers(4, vocab, p).astype(np.int32),
            completion_ids=rng.integers(4, vocab, c).astype(np.int32),
            logprobs=rng.uniform(-6, -1, c).astype(np.float32),
            version=0,
        )
        for i, (p, c) in enumerate(shapes)
    ]
    return Batch(
        rollouts=rollouts,
        group_index=np.zeros(rows, np.int64),
        rewards=np.zeros(rows, np.float32),
        advantages=rng.uniform(-1, 1, rows).astype(np.float32) if advantages is None else advantages,
        ref_logprobs=None,
        staleness=np.zeros(rows, np.int64),
    )


def assert_same_step(want: dict, got: dict, rtol: float, atol: float) -> None:
    """Every step metric but the timing and padding, and every parameter's gradient, of `got` equal
    `want`'s (each a dict with "metrics" and "grads"); the gradient is not trivially zero."""
    for key, value in want["metrics"].items():
        if key not in ("time_s", "padded_tokens"):
            assert got["metrics"][key] == pytest.approx(value, rel=rtol, abs=atol), key
    assert want["metrics"]["grad_norm"] > 1e-3
    for name, grad in want["grads"].items():
        torch.testing.assert_close(got["grads"][name], grad, rtol=rtol, atol=atol, msg=name)
