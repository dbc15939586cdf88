"""Behaviour-mismatch corrections shared by every objective: IcePop, sequence-level masked IS, TIS caps.

    loss.icepop_low=0.5 loss.icepop_high=2        # any loss.name; defaults: all off

The generator (vLLM: bf16, its kernels, MoE routing; older weights when stale) samples with pi_b
while the trainer computes pi_old for the same tokens (this step's forward, detached: the weights
before the optimizer step); k = pi_old / pi_b on each token. Two kinds of correction:

- importance weights (`tis_token_cap`: min(k, C); `tis_seq_cap`: min(prod_t k, C); IcePop:
  k * 1[a <= k <= b], its paper's M(k)). An objective's own ratio is taken against pi_b, so it
  already carries k: multiplying by a weight in k would weight a token by k * min(k, C). With a
  weight on, the objective is therefore run *decoupled* (Hilton et al. 2021; verl's decoupled
  mode): its ratio against pi_old (= 1 in value, the on-policy gradient) and the truncated weight
  supplies the sampler correction, so a token's importance weight is min(k, C) on every objective.
- masks (`seq_mis_*`, and IcePop's band): a token or sequence outside the band contributes no loss;
  alone they keep the objective's ratio against pi_b (verl's bypass mode with rejection).

Objectives that weight by a truncated k themselves (tis: tis_cap; decoupled_ppo: behav_weight_cap;
`Objective.weights_behaviour`) take the masks only; a TIS cap on them is refused by resolve_loss.
A masked token still counts in the aggregation's normaliser (a zero-loss token), as in the IcePop
paper's 1/|y_i| sum_t; docs/losses.md compares verl. Papers: docs/losses.md.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from streamrl.config.schema import LossConfig
    from streamrl.losses.inputs import LossInputs
    from streamrl.losses.registry import Objective

KEYS = ("icepop_low", "icepop_high", "seq_mis_low", "seq_mis_high", "tis_token_cap", "tis_seq_cap")


def enabled(cfg: LossConfig) -> bool:
    return any(getattr(cfg, k, None) is not None for k in KEYS)


def _icepop(cfg: LossConfig) -> bool:
    return cfg.icepop_low is not None or cfg.icepop_high is not None


def weighted(cfg: LossConfig, obj: Objective) -> bool:
    """Whether this config puts an importance weight in k on the objective (then run decoupled)."""
    if obj.weights_behaviour:
        return False
    return _icepop(cfg) or cfg.tis_token_cap is not None or cfg.tis_seq_cap is not None


def objective_inputs(cfg: LossConfig, obj: Objective, inp: LossInputs) -> LossInputs:
    """What the objective sees: with an importance weight on, its ratio is taken against pi_old
    (this step's detached log-probs) instead of pi_b, the weight carrying the sampler correction."""
    if not weighted(cfg, obj):
        return inp
    return replace(inp, old_logprobs=inp.logprobs.detach())


def correction(cfg: LossConfig, inp: LossInputs, obj: Objective) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """([B, T] detached factor for the per-token loss, {metric: [B, T] bool/float to average})."""
    mask = inp.mask.to(inp.logprobs.dtype)
    c = cfg.log_ratio_clamp
    lr = torch.clamp(inp.logprobs.detach() - inp.old_logprobs.detach(), -c, c) * mask
    k = torch.exp(lr)
    n = mask.sum(-1).clamp(min=1)
    factor = torch.ones_like(k)
    tok: dict[str, torch.Tensor] = {}
    seq: dict[str, torch.Tensor] = {}
    if weighted(cfg, obj):
        if cfg.tis_seq_cap is not None:
            # the product of the token ratios in log space, clamped so a long stale sequence cannot overflow
            w = torch.exp(lr.sum(-1).clamp(-c, c))
            factor = w.clamp(max=cfg.tis_seq_cap)[:, None].expand_as(k)
            seq["tis_seq_capped_frac"] = w > cfg.tis_seq_cap
        elif cfg.tis_token_cap is not None:
            factor = k.clamp(max=cfg.tis_token_cap)
            tok["tis_token_capped_frac"] = k > cfg.tis_token_cap
        else:
            factor = k  # IcePop alone: M(k) = k inside the band
        tok["is_weight_mean"] = factor
    if _icepop(cfg):
        out = torch.zeros_like(k, dtype=torch.bool)
        if cfg.icepop_low is not None:
            out |= k < cfg.icepop_low
        if cfg.icepop_high is not None:
            out |= k > cfg.icepop_high
        factor = factor * (~out).to(k.dtype)
        tok["icepop_masked_frac"] = out
    if cfg.seq_mis_low is not None or cfg.seq_mis_high is not None:
        geo = torch.exp(lr.sum(-1) / n)
        out = torch.zeros_like(geo, dtype=torch.bool)
        if cfg.seq_mis_low is not None:
            out |= geo < cfg.seq_mis_low
        if cfg.seq_mis_high is not None:
            out |= geo > cfg.seq_mis_high
        factor = factor * (~out).to(k.dtype)[:, None]
        seq["seq_mis_masked_frac"] = out
    return factor.detach(), {**tok, **{key: v[:, None].expand_as(k) for key, v in seq.items()}}
