"""A trainer Batch of one group whose rollouts have given (prompt, completion) lengths: random
token ids, behaviour log-probs and advantages from one seeded generator (the trainer tests' input)."""

from __future__ import annotations

import numpy as np

from streamrl.batch import Batch
from streamrl.messages import Rollout


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
