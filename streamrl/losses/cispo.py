"""CISPO (MiniMax-M1, 2025): clip the importance weight, never drop a token's gradient.

    loss.name=cispo      (typically with a large eps_high and aggregation=token_mean)

Per token: -sg(clip(r, 1-eps_low, 1+eps_high)) * A * l. Unlike PPO-clip, a clipped token still
gets a (bounded) REINFORCE gradient; the value itself is only a surrogate.
"""

from __future__ import annotations

import torch

from streamrl.losses import ClipSettings, LossInputs, register_loss
from streamrl.losses.core import Terms, log_ratio


@register_loss("cispo", settings=ClipSettings)
def cispo(cfg, inp: LossInputs) -> Terms:
    ratio = torch.exp(log_ratio(inp.logprobs, inp.old_logprobs, cfg.log_ratio_clamp)).detach()
    weight = ratio.clamp(1 - cfg.eps_low, 1 + cfg.eps_high)
    adv = inp.advantages[:, None]
    return Terms(
        loss=-weight * adv * inp.logprobs,
        ratio=ratio,
        clip_low=ratio < 1 - cfg.eps_low,
        clip_high=ratio > 1 + cfg.eps_high,
    )
