"""SAPO (Gao et al. 2025, "Soft Adaptive Policy Optimization"): a soft sigmoid gate, no hard clip.

    loss.name=sapo       (temperatures: loss.sapo_tau_pos, loss.sapo_tau_neg; paper: 1.0, 1.05; seq_mean)

Per token: -(4/tau) * sigmoid(tau (r - 1)) * A, tau = tau_pos if A > 0 else tau_neg.
Its gradient is -4 p (1-p) r A dl with p = sigmoid(tau (r-1)): exactly the on-policy gradient at
r = 1, smoothly fading as r leaves 1 (faster for negative advantages when tau_neg > tau_pos).
"""

from __future__ import annotations

import torch
from pydantic import Field

from streamrl.config.schema import Aggregation
from streamrl.losses import LossInputs, LossSettings, register_loss
from streamrl.losses.core import Terms, log_ratio


class SAPOSettings(LossSettings):
    sapo_tau_pos: float = Field(1.0, gt=0)
    """Gate temperature for tokens with A > 0."""
    sapo_tau_neg: float = Field(1.05, gt=0)
    """Gate temperature for A <= 0 (the paper keeps it >= tau_pos for stability)."""
    aggregation: Aggregation = "seq_mean"
    """The paper's objective averages each sequence's tokens, then the sequences."""


@register_loss("sapo", settings=SAPOSettings)
def sapo(cfg, inp: LossInputs) -> Terms:
    ratio = torch.exp(log_ratio(inp.logprobs, inp.old_logprobs, cfg.log_ratio_clamp))
    adv = inp.advantages[:, None].to(ratio.dtype)
    tau = torch.where(adv > 0, ratio.new_tensor(cfg.sapo_tau_pos), ratio.new_tensor(cfg.sapo_tau_neg))
    gate = (4.0 / tau) * torch.sigmoid(tau * (ratio - 1))
    none = torch.zeros_like(ratio, dtype=torch.bool)
    return Terms(loss=-gate * adv, ratio=ratio.detach(), clip_low=none, clip_high=none)
