"""The reward function called on a batch of completions: off the event loop, each call bounded by
reward.timeout_s, each failure that completion's own. What the reward worker annotates
(workers/reward.py) and what `streamrl eval` scores (streamrl/launch/evaluate.py), so a completion
gets the same reward, or the same error, in both.

    fn = make_reward(cfg.reward)                                   # streamrl/annotate/rewards.py
    out = await score_batch(fn, [(prompt, completion, meta)], Calls("reward"), timeout_s=30.0)
    value, error, parts = out[0]          # error "" on success; parts: reward.components' scores
"""

from __future__ import annotations

import math
from typing import Callable

from streamrl.core.calls import Calls, CallTimeout


async def score_batch(
    fn: Callable, items: list[tuple[str, str, dict]], calls: Calls, timeout_s: float, on_timeout: Callable | None = None
) -> list[tuple[float, str, dict]]:
    """(value, error, parts) per (prompt, completion, meta), in order, all on one call thread (the
    event loop wakes once per batch). A call that raises, hangs past `timeout_s` (then `on_timeout()`
    is called) or returns a non-finite value gives (0.0, why, {}): user code failing is that
    completion's failure, never the caller's."""

    def score(item: tuple[str, str, dict]):
        out = fn(*item)
        return float(out), getattr(out, "parts", {})

    results = []
    for ok, got in await calls.map(score, items, timeout_s):
        if not ok and isinstance(got, CallTimeout):
            if on_timeout is not None:
                on_timeout()
            results.append((0.0, f"reward function timed out after {timeout_s}s", {}))
        elif not ok:
            results.append((0.0, f"reward function raised {type(got).__name__}: {got}", {}))
        elif math.isfinite(got[0]):
            results.append((got[0], "", got[1]))
        else:
            results.append((0.0, f"reward function returned {got[0]}", {}))
    return results
