"""What the assembler hands the trainer: complete groups, with rewards, advantages, staleness.

batch = await assembler.next_batch(version)     # streamrl/assemble/assembler.py
batch.rollouts[i].completion_ids, batch.advantages[i], batch.ref_logprobs[i]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from streamrl.core.errors import FatalError
from streamrl.core.messages import Rollout


@dataclass
class Batch:
    rollouts: list[Rollout]
    """Flattened groups, group after group (len = groups * group_size)."""
    group_index: np.ndarray
    """Group number (0..groups-1) of each rollout."""
    rewards: np.ndarray
    """Combined scalar reward per rollout (float32)."""
    advantages: np.ndarray
    """Advantage per rollout (float32), computed within its group."""
    ref_logprobs: list[np.ndarray] | None
    """Reference log-prob per completion token, when the loss has a KL term."""
    staleness: np.ndarray
    """Trainer version minus each rollout's oldest token version."""
    reward_components: dict[str, np.ndarray] = field(default_factory=dict)
    """Each annotation that fed the reward, separately (for logging)."""
    stats: dict[str, float] = field(default_factory=dict)
    """Assembler counters for this batch (dropped_stale, filtered, wait_s, ...)."""
    group_ids: list[str] = field(default_factory=list)
    loss_mask: np.ndarray | None = None
    annotation_texts: dict[str, list[str]] = field(default_factory=dict)
    """Annotation key -> each rollout's annotation text (the judge's reply), for keys whose producer
    wrote any ("" where it wrote none); samples.jsonl keeps them, the loss never reads them."""
    """Per-rollout 0/1 weight of its tokens in the loss (DAPO overlong filtering); None = all 1."""

    def __len__(self) -> int:
        return len(self.rollouts)

    @property
    def num_tokens(self) -> int:
        return int(sum(len(r.completion_ids) for r in self.rollouts))

    @property
    def num_loss_tokens(self) -> int:
        """Tokens that count in the loss (the global normaliser of token-mean aggregation)."""
        weights = self.loss_mask if self.loss_mask is not None else [1.0] * len(self.rollouts)
        return int(sum(_trained(r) * float(w) for r, w in zip(self.rollouts, weights)))

    def select(self, index: list[int]) -> "Batch":
        """The rollouts at `index`, in that order (a micro-batch of rows sorted by length)."""
        idx = np.asarray(index, dtype=np.int64)
        return Batch(
            rollouts=[self.rollouts[i] for i in index],
            group_index=self.group_index[idx],
            rewards=self.rewards[idx],
            advantages=self.advantages[idx],
            ref_logprobs=None if self.ref_logprobs is None else [self.ref_logprobs[i] for i in index],
            staleness=self.staleness[idx],
            reward_components={k: v[idx] for k, v in self.reward_components.items()},
            stats=dict(self.stats),
            group_ids=list(self.group_ids),
            loss_mask=None if self.loss_mask is None else self.loss_mask[idx],
            annotation_texts={k: [v[i] for i in index] for k, v in self.annotation_texts.items()},
        )

    def shard(self, rank: int, world: int) -> "Batch":
        """The slice of rollouts a data-parallel rank trains on (contiguous, balanced)."""
        n = len(self.rollouts)
        lo, hi = rank * n // world, (rank + 1) * n // world
        return Batch(
            rollouts=self.rollouts[lo:hi],
            group_index=self.group_index[lo:hi],
            rewards=self.rewards[lo:hi],
            advantages=self.advantages[lo:hi],
            ref_logprobs=None if self.ref_logprobs is None else self.ref_logprobs[lo:hi],
            staleness=self.staleness[lo:hi],
            reward_components={k: v[lo:hi] for k, v in self.reward_components.items()},
            stats=dict(self.stats),
            group_ids=list(self.group_ids),
            loss_mask=None if self.loss_mask is None else self.loss_mask[lo:hi],
            annotation_texts={k: v[lo:hi] for k, v in self.annotation_texts.items()},
        )


def zero_variance_frac(rewards: np.ndarray, group_index: np.ndarray) -> float:
    """Fraction of groups whose rewards are all equal: no advantage, so no learning signal (pure).
    metrics.jsonl's `zero_variance_frac`; 1.0 on every step is a job that learns nothing."""
    r = np.asarray(rewards, dtype=np.float64).reshape(-1)
    g = np.asarray(group_index).reshape(-1)
    if r.shape != g.shape:
        raise ValueError(f"rewards has {r.size} entries but group_index has {g.size}; pass one group id per reward")
    if g.size == 0:
        return 0.0
    groups = np.unique(g)
    return float(sum(1 for gid in groups if np.ptp(r[g == gid]) == 0) / len(groups))


def _trained(r: Rollout) -> int:
    """Completion tokens of `r` the loss counts: all but an episode's observation tokens."""
    return len(r.completion_ids) - sum(e - s for s, e in r.obs_spans)


def no_loss_tokens(batch: Batch, max_tokens: int) -> FatalError:
    """The error for a batch in which every row is masked: a step on it would train on nothing (a
    FatalError: a restarted trainer would get such batches again, so `streamrl up` stops the job)."""
    cut = sum(r.finish_reason == "length" for r in batch.rollouts)
    masked = 0 if batch.loss_mask is None else int((np.asarray(batch.loss_mask) == 0).sum())
    return FatalError(
        f"every row of this batch ({len(batch)} rows) is masked, so the step would train on nothing: "
        f"{masked} rows masked by loss.overlong_filter ({cut} cut at generator.max_tokens={max_tokens}), the "
        "rest have no completion token outside observations; raise generator.max_tokens or set "
        "loss.overlong_filter=false, and check that episodes' completions are not all observation tokens"
    )
