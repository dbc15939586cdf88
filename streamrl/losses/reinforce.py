"""Plain REINFORCE with no off-policy correction: the baseline that stale data is unsafe for.

    loss.name=reinforce

Per token: -A * l. Stale or mismatched samples are trained as if on-policy (no ratio, no clip);
compare it with `tis` or `decoupled_ppo` at max_staleness > 0 (bench/objectives.py).
"""

from __future__ import annotations

import torch

from streamrl.losses import LossInputs, LossSettings, register_loss
from streamrl.losses.core import Terms, log_ratio


@register_loss("reinforce", settings=LossSettings)  # no parameters of its own
def reinforce(cfg, inp: LossInputs) -> Terms:
    ratio = torch.exp(log_ratio(inp.logprobs, inp.old_logprobs, cfg.log_ratio_clamp)).detach()
    none = torch.zeros_like(ratio, dtype=torch.bool)
    return Terms(loss=-inp.advantages[:, None] * inp.logprobs, ratio=ratio, clip_low=none, clip_high=none)
