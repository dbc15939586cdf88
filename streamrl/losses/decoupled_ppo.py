"""Decoupled PPO (AReaL, Fu et al. 2025) for stale, asynchronously generated data.

    loss.name=decoupled_ppo    (needs LossInputs.prox_logprobs; cap: loss.behav_weight_cap)

The trust region is taken around the proximal policy l_prox (the weights before this optimizer
step), not around the stale behaviour policy l_b that sampled the tokens:
    -sg(min(exp(l_prox - l_b), cap)) * min(u A, clip(u, 1-eps_low, 1+eps_high) A),  u = exp(l - l_prox)
with the optional dual clip. The truncated weight corrects for l_b != l_prox off-policyness.
"""

from __future__ import annotations

import torch
from pydantic import Field

from streamrl.losses import LossInputs, register_loss
from streamrl.losses.core import Terms, log_ratio, ppo_clip
from streamrl.losses.settings import PPOSettings


class DecoupledPPOSettings(PPOSettings):
    behav_weight_cap: float = Field(5.0, gt=0)
    """Truncation of the behaviour weight exp(l_prox - l_b)."""


@register_loss("decoupled_ppo", requires=("prox_logprobs",), settings=DecoupledPPOSettings, weights_behaviour=True)
def decoupled_ppo(cfg, inp: LossInputs) -> Terms:
    prox = inp.prox_logprobs.detach()
    u = torch.exp(log_ratio(inp.logprobs, prox, cfg.log_ratio_clamp))
    terms = ppo_clip(u, inp.advantages[:, None], cfg.eps_low, cfg.eps_high, cfg.dual_clip_c)
    behav = torch.exp(log_ratio(prox, inp.old_logprobs.detach(), cfg.log_ratio_clamp))
    terms.loss = behav.clamp(max=cfg.behav_weight_cap) * terms.loss
    terms.extra["behav_capped_frac"] = behav > cfg.behav_weight_cap
    return terms
