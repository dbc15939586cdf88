"""PPO-clip family: grpo, dr_grpo, dapo (one per-token surrogate, different configs).

    loss.name=grpo | dr_grpo | dapo      (used through streamrl.losses.compute_loss)

All three are -min(r A, clip(r, 1-eps_low, 1+eps_high) A) per token, with r = exp(l - l_b) and
the optional dual clip (loss.dual_clip_c) for A < 0. What distinguishes them lives in the
config presets (streamrl.losses.LOSS_PRESETS):
  dr_grpo  advantage=group_mean (no std), aggregation=fixed_horizon (constant normaliser)
  dapo     clip-higher (eps_high=0.28 > eps_low), token_mean aggregation, dynamic sampling
"""

from __future__ import annotations

import torch

from streamrl.losses import LossInputs, register_loss
from streamrl.losses.core import Terms, log_ratio, ppo_clip


@register_loss("grpo")
@register_loss("dr_grpo")
@register_loss("dapo")
def clipped_surrogate(cfg, inp: LossInputs) -> Terms:
    ratio = torch.exp(log_ratio(inp.logprobs, inp.old_logprobs, cfg.log_ratio_clamp))
    return ppo_clip(ratio, inp.advantages[:, None], cfg.eps_low, cfg.eps_high, cfg.dual_clip_c)
