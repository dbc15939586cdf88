"""Clipped REINFORCE: on-policy REINFORCE that ignores tokens outside the PPO trust region.

    loss.name=clipped_reinforce    (docs/losses.md shows this file as the template for new objectives)

Per token: -A * l where 1-eps_low <= r <= 1+eps_high, and 0 (no gradient) elsewhere, with
r = exp(l - l_b). A token that drifted far from the sampler is dropped rather than re-weighted.
"""

from __future__ import annotations

import torch

from streamrl.losses import ClipSettings, LossInputs, register_loss
from streamrl.losses.core import Terms, log_ratio


@register_loss("clipped_reinforce", settings=ClipSettings)  # its parameters: eps_low, eps_high
def clipped_reinforce(cfg, inp: LossInputs) -> Terms:
    ratio = torch.exp(log_ratio(inp.logprobs, inp.old_logprobs, cfg.log_ratio_clamp)).detach()
    low, high = ratio < 1 - cfg.eps_low, ratio > 1 + cfg.eps_high
    keep = (~(low | high)).to(inp.logprobs.dtype)
    return Terms(
        loss=-keep * inp.advantages[:, None] * inp.logprobs,
        ratio=ratio,
        clip_low=low,
        clip_high=high,
    )
