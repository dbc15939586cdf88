"""SAPO (Gao et al. 2025, "Soft Adaptive Policy Optimization"): a soft sigmoid gate, no hard clip.

    loss.name=sapo       (temperatures: loss.sapo_tau_pos, loss.sapo_tau_neg; paper: 1.0, 1.05)

Per token: -(4/tau) * sigmoid(tau (r - 1)) * A, tau = tau_pos if A > 0 else tau_neg.
Its gradient is -4 p (1-p) r A dl with p = sigmoid(tau (r-1)): exactly the on-policy gradient at
r = 1, smoothly fading as r leaves 1 (faster for negative advantages when tau_neg > tau_pos).
"""

from __future__ import annotations

import torch

from streamrl.losses import LossInputs, register_loss
from streamrl.losses.core import Terms, log_ratio


@register_loss("sapo")
def sapo(cfg, inp: LossInputs) -> Terms:
    ratio = torch.exp(log_ratio(inp.logprobs, inp.old_logprobs, cfg.log_ratio_clamp))
    adv = inp.advantages[:, None].to(ratio.dtype)
    tau = torch.where(adv > 0, ratio.new_tensor(cfg.sapo_tau_pos), ratio.new_tensor(cfg.sapo_tau_neg))
    gate = (4.0 / tau) * torch.sigmoid(tau * (ratio - 1))
    none = torch.zeros_like(ratio, dtype=torch.bool)
    return Terms(loss=-gate * adv, ratio=ratio.detach(), clip_low=none, clip_high=none)
