"""The one-sample rollout the reward worker tests score: a group of one, a one-token prompt and
completion, and the text, prompt text and task metadata the reward function reads."""

from __future__ import annotations

import numpy as np

from streamrl.core.messages import Rollout


def rollout(i: int, text: str, prompt_text: str = "", meta: dict | None = None) -> Rollout:
    """Rollout `g{i}:0` of group `g{i}` (group_size 1, version 0) with completion text `text`."""
    return Rollout(
        rollout_id=f"g{i}:0",
        group_id=f"g{i}",
        sample=0,
        group_size=1,
        prompt_ids=np.array([4]),
        completion_ids=np.array([5]),
        logprobs=np.array([-1.0]),
        version=0,
        text=text,
        prompt_text=prompt_text,
        meta=meta or {},
    )
