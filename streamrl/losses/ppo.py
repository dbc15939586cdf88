"""PPO-clip family: grpo, dr_grpo, dapo (one per-token surrogate, different configs).

    loss.name=grpo | dr_grpo | dapo      (used through streamrl.losses.compute_loss)

All three are -min(r A, clip(r, 1-eps_low, 1+eps_high) A) per token, with r = exp(l - l_b) and
the optional dual clip (loss.dual_clip_c) for A < 0. What distinguishes them is their settings:
  grpo     token_mean by default (DAPO's fix of the paper's per-sequence mean; docs/losses.md)
  dr_grpo  advantage=group_mean (no std), aggregation=fixed_horizon (constant normaliser)
  dapo     clip-higher (eps_high=0.28 > eps_low), token_mean aggregation, dynamic sampling
"""

from __future__ import annotations

from typing import Literal

import torch

from streamrl.config.schema import Advantage, Aggregation
from streamrl.losses import LossInputs, register_loss
from streamrl.losses.core import Terms, log_ratio, ppo_clip
from streamrl.losses.settings import PPOSettings


class DrGRPOSettings(PPOSettings):
    fixed = {"advantage": "group_mean", "aggregation": "fixed_horizon"}
    why = " (Dr. GRPO removes the std and length normalisations that bias GRPO)"
    advantage: Advantage = "group_mean"
    aggregation: Aggregation = "fixed_horizon"


class DAPOSettings(PPOSettings):
    fixed = {"aggregation": "token_mean"}
    why = " (DAPO's token-level policy-gradient loss)"
    eps_high: float = 0.28
    """Clip-higher: the paper's upper range."""
    aggregation: Literal["token_mean"] = "token_mean"
    dynamic_sampling: bool = True


@register_loss("grpo", settings=PPOSettings)
@register_loss("dr_grpo", settings=DrGRPOSettings)
@register_loss("dapo", settings=DAPOSettings)
def clipped_surrogate(cfg, inp: LossInputs) -> Terms:
    ratio = torch.exp(log_ratio(inp.logprobs, inp.old_logprobs, cfg.log_ratio_clamp))
    return ppo_clip(ratio, inp.advantages[:, None], cfg.eps_low, cfg.eps_high, cfg.dual_clip_c)
