"""Group-relative advantages and DAPO's batch-level reward shaping (numpy, pure, no I/O).

    from streamrl.assemble.advantages import batch_advantages
    adv = batch_advantages(rewards, group_index, cfg.loss.advantage)   # the assembler calls this

Modes (cfg.loss.advantage):
  group_norm  (r - mean) / (std + eps)        GRPO (std with Bessel's correction, as torch.std)
  group_mean  r - mean                        Dr. GRPO: no std, so easy/hard groups are not re-weighted
  loo         r_i - mean_{j != i} r_j         RLOO: the baseline excludes the sample itself
A group of one sample has no baseline: its advantage is 0 (no learning signal) in every mode.
"""

from __future__ import annotations

import numpy as np

from streamrl.core.errors import ConfigError

ADVANTAGE_MODES = ("group_norm", "group_mean", "loo")


def group_advantages(rewards: np.ndarray, mode: str, eps: float = 1e-6) -> np.ndarray:
    """Advantages of the samples of ONE group (float64, same length as `rewards`)."""
    r = np.asarray(rewards, dtype=np.float64).reshape(-1)
    n = r.size
    if mode not in ADVANTAGE_MODES:
        raise ConfigError(f"unknown advantage mode {mode!r}; set loss.advantage to one of {', '.join(ADVANTAGE_MODES)}")
    if n < 2:
        return np.zeros(n)
    mean = r.mean()
    if mode == "group_mean":
        return r - mean
    if mode == "group_norm":
        return (r - mean) / (r.std(ddof=1) + eps)
    # loo: r_i - (sum - r_i)/(n-1) == n/(n-1) * (r_i - mean)
    return r - (r.sum() - r) / (n - 1)


def batch_advantages(rewards: np.ndarray, group_index: np.ndarray, mode: str, eps: float = 1e-6) -> np.ndarray:
    """Advantages for many groups at once; `group_index[i]` names the group of sample i.

    Groups need not be contiguous or numbered from 0. Returns float32 (what Batch.advantages holds).
    """
    r = np.asarray(rewards, dtype=np.float64).reshape(-1)
    g = np.asarray(group_index).reshape(-1)
    if r.shape != g.shape:
        raise ValueError(f"rewards has {r.size} entries but group_index has {g.size}; pass one group id per reward")
    out = np.zeros_like(r)
    for gid in np.unique(g):
        sel = g == gid
        out[sel] = group_advantages(r[sel], mode, eps)
    return out.astype(np.float32)


def overlong_penalty(lengths: np.ndarray, max_tokens: int, buffer: int, penalty: float = 1.0) -> np.ndarray:
    """DAPO soft overlong punishment, added to the reward (float64, <= 0).

    With L = max_tokens and the last `buffer` tokens as the punishment interval:
    0 for len <= L - buffer, a linear ramp (L - buffer - len) / buffer * penalty inside the
    interval, and -penalty past L. buffer=0 disables the ramp (only len > L is punished).
    """
    if buffer < 0 or buffer > max_tokens:
        raise ConfigError(
            f"loss.overlong_buffer={buffer} must lie in [0, generator.max_tokens={max_tokens}]; "
            "DAPO uses about a fifth of max_tokens"
        )
    n = np.asarray(lengths, dtype=np.float64).reshape(-1)
    start = max_tokens - buffer
    ramp = (start - n) / buffer * penalty if buffer else np.zeros_like(n)
    return np.where(n <= start, 0.0, np.where(n <= max_tokens, ramp, -penalty))
