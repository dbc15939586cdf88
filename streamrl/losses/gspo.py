"""GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): one ratio per sequence.

    loss.name=gspo      (defaults: eps_low=3e-4, eps_high=4e-4; aggregation is always seq_mean)

s_i = exp(mean_t (l - l_b)) over the sequence's real tokens, clipped per sequence as in PPO;
every token of sequence i carries the loss -min(s_i A_i, clip(s_i) A_i). With seq_mean this is
exactly the paper's 1/G sum_i of the sequence term, and d/dl_t = -A_i s_i / (G |y_i|), the
paper's gradient (identical to its GSPO-token form when A is per sequence). Any other
aggregation would weight a sequence by its length, which the method exists to avoid, so it is
refused rather than silently accepted.
"""

from __future__ import annotations

from typing import Literal

import torch

from streamrl.losses import LossInputs, register_loss
from streamrl.losses.core import Terms, ppo_clip
from streamrl.losses.settings import ClipSettings


class GSPOSettings(ClipSettings):
    fixed = {"aggregation": "seq_mean"}
    why = " (GSPO is a sequence-level objective: 1/G sum_i of one term per sequence)"
    eps_low: float = 3e-4
    """The paper's clip range on the sequence ratio (much narrower than a token ratio's)."""
    eps_high: float = 4e-4
    aggregation: Literal["seq_mean"] = "seq_mean"


@register_loss("gspo", settings=GSPOSettings)
def gspo(cfg, inp: LossInputs) -> Terms:
    mask = inp.mask.to(inp.logprobs.dtype)
    n = mask.sum(-1).clamp(min=1)
    # mask before summing so padding garbage never reaches the ratio
    seq_log_ratio = ((inp.logprobs - inp.old_logprobs) * mask).sum(-1) / n
    s = torch.exp(seq_log_ratio.clamp(-cfg.log_ratio_clamp, cfg.log_ratio_clamp))
    ratio = s[:, None].expand_as(inp.logprobs)
    return ppo_clip(ratio, inp.advantages[:, None], cfg.eps_low, cfg.eps_high)
