"""Behaviour-mismatch corrections shared by every objective: IcePop, sequence-level masked IS, TIS caps.

    loss.icepop_low=0.5 loss.icepop_high=2        # any loss.name; defaults: all off

The generator (vLLM: bf16, its kernels, MoE routing) samples with pi_b while the trainer computes
pi_train for the same tokens; r = pi_train / pi_b on each token (pi_train = this step's forward,
detached: the weights before the optimizer step). `correction` turns the settings into one detached
per-token factor that `core.run` multiplies into the objective's per-token loss before aggregation,
so every objective composes with it and the aggregation's normalisers are unchanged (a masked token
counts as a zero-loss token, as in verl and slime). Papers and what each fixes: docs/losses.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from streamrl.config.schema import LossConfig
    from streamrl.losses.inputs import LossInputs


def enabled(cfg: LossConfig) -> bool:
    keys = ("icepop_low", "icepop_high", "seq_mis_low", "seq_mis_high", "tis_token_cap", "tis_seq_cap")
    return any(getattr(cfg, k, None) is not None for k in keys)


def correction(cfg: LossConfig, inp: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """([B, T] detached factor for the per-token loss, {metric: [B, T] or [B] bool/float to average})."""
    mask = inp.mask.to(inp.logprobs.dtype)
    c = cfg.log_ratio_clamp
    lr = torch.clamp(inp.logprobs.detach() - inp.old_logprobs.detach(), -c, c) * mask
    r = torch.exp(lr)
    factor = torch.ones_like(r)
    tok: dict[str, torch.Tensor] = {}
    seq: dict[str, torch.Tensor] = {}
    if cfg.icepop_low is not None or cfg.icepop_high is not None:
        out = torch.zeros_like(r, dtype=torch.bool)
        if cfg.icepop_low is not None:
            out |= r < cfg.icepop_low
        if cfg.icepop_high is not None:
            out |= r > cfg.icepop_high
        factor = factor * (~out).to(r.dtype)
        tok["icepop_masked_frac"] = out
    if cfg.tis_token_cap is not None:
        factor = factor * r.clamp(max=cfg.tis_token_cap)
        tok["tis_token_capped_frac"] = r > cfg.tis_token_cap
    n = mask.sum(-1).clamp(min=1)
    if cfg.seq_mis_low is not None or cfg.seq_mis_high is not None:
        geo = torch.exp(lr.sum(-1) / n)
        out = torch.zeros_like(geo, dtype=torch.bool)
        if cfg.seq_mis_low is not None:
            out |= geo < cfg.seq_mis_low
        if cfg.seq_mis_high is not None:
            out |= geo > cfg.seq_mis_high
        factor = factor * (~out).to(r.dtype)[:, None]
        seq["seq_mis_masked_frac"] = out
    if cfg.tis_seq_cap is not None:
        # the product of the token ratios in log space, clamped so a long stale sequence cannot overflow
        w = torch.exp(lr.sum(-1).clamp(-cfg.log_ratio_clamp, cfg.log_ratio_clamp))
        factor = factor * w.clamp(max=cfg.tis_seq_cap)[:, None]
        seq["tis_seq_capped_frac"] = w > cfg.tis_seq_cap
    return factor.detach(), {**tok, **{k: v[:, None].expand_as(r) for k, v in seq.items()}}
