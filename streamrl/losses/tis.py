"""REINFORCE with truncated importance sampling (TIS) against the behaviour policy.

    loss.name=tis        (cap: loss.tis_cap)

Per token: -sg(min(r, c)) * A * l with r = exp(l - l_b). Corrects the mismatch between the
sampler (vLLM, possibly stale weights) and the trainer while bounding the variance by c.
"""

from __future__ import annotations

import torch
from pydantic import Field

from streamrl.losses import LossInputs, LossSettings, register_loss
from streamrl.losses.core import Terms, log_ratio


class TISSettings(LossSettings):
    tis_cap: float = Field(2.0, gt=0)
    """Truncation c of the importance weight min(r, c)."""


@register_loss("tis", settings=TISSettings, weights_behaviour=True)
def tis(cfg, inp: LossInputs) -> Terms:
    ratio = torch.exp(log_ratio(inp.logprobs, inp.old_logprobs, cfg.log_ratio_clamp)).detach()
    high = ratio > cfg.tis_cap
    return Terms(
        loss=-ratio.clamp(max=cfg.tis_cap) * inp.advantages[:, None] * inp.logprobs,
        ratio=ratio,
        clip_low=torch.zeros_like(high),
        clip_high=high,
    )
