"""Shared loss math: ratios, PPO clipping, KL estimators, global-batch aggregation, metrics.

Used by every objective module in streamrl/losses and by compute_loss(); pure torch, no I/O.
An objective returns per-token `Terms`; `run` masks, aggregates, adds KL and entropy terms,
and scales everything to the global batch (see docs/losses.md, "Aggregation").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from streamrl.core.errors import ConfigError
from streamrl.losses import corrections
from streamrl.losses.registry import loss_requirements

if TYPE_CHECKING:
    from streamrl.config.schema import LossConfig
    from streamrl.losses.inputs import LossInputs
    from streamrl.losses.registry import Objective


@dataclass
class Terms:
    loss: torch.Tensor
    """[B, T] per-token policy-gradient loss (padding is masked by the caller)."""
    ratio: torch.Tensor
    """[B, T] the importance ratio the objective used (for the ratio_mean metric)."""
    clip_low: torch.Tensor
    """[B, T] bool: tokens whose gradient a lower clip bound removed or bounded."""
    clip_high: torch.Tensor
    """[B, T] bool: same for the upper bound."""
    extra: dict[str, torch.Tensor] = field(default_factory=dict)
    """Further per-token quantities reported as token means (e.g. clip_frac_dual)."""


def log_ratio(num: torch.Tensor, den: torch.Tensor, clamp: float) -> torch.Tensor:
    """num - den clamped to [-clamp, clamp], so exp() of it never overflows on stale tokens."""
    return torch.clamp(num - den, -clamp, clamp)


def ppo_clip(
    ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float, dual_c: float | None = None
) -> Terms:
    """-min(r A, clip(r, 1-eps_low, 1+eps_high) A), with the dual clip -max(., c A) for A < 0.

    Written with explicit masks instead of min/max so the gradient is exactly zero where a clip
    is active (torch.maximum splits the gradient at ties).
    """
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high)
    clip_low = (adv < 0) & (ratio < 1 - eps_low)
    clip_high = (adv > 0) & (ratio > 1 + eps_high)
    loss = torch.where(clip_low | clip_high, -clipped.detach() * adv, -ratio * adv)
    extra = {}
    if dual_c is not None:
        # for A < 0 the PPO loss grows with r without bound; the dual clip caps it at -c A
        dual = (adv < 0) & (ratio > dual_c)
        loss = torch.where(dual, (-dual_c * adv).expand_as(loss), loss)
        extra["clip_frac_dual"] = dual
    return Terms(loss=loss, ratio=ratio.detach(), clip_low=clip_low, clip_high=clip_high, extra=extra)


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str, clamp: float) -> torch.Tensor:
    """Per-token estimators of KL(pi || ref) on samples from pi (Schulman, "Approximating KL")."""
    d = log_ratio(ref_logprobs, logprobs, clamp)  # log(ref / pi)
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d * d
    if kind == "k3":
        return torch.exp(d) - d - 1
    raise ConfigError(f"unknown loss.kl_estimator={kind!r}; use k1, k2 or k3")


@dataclass(frozen=True)
class Norm:
    """Global-batch normalisers for one micro-batch."""

    tokens: float
    seqs: float
    horizon: int | None


def aggregate(x: torch.Tensor, mask: torch.Tensor, mode: str, norm: Norm) -> torch.Tensor:
    """This micro-batch's share of the global aggregate of per-token values x.

    token_mean:     sum_bt x m / total_tokens
    seq_mean:       sum_b (sum_t x m / n_b) / total_seqs
    fixed_horizon:  sum_bt x m / (total_seqs * horizon)
    """
    xm = x * mask
    if mode == "token_mean":
        return xm.sum() / norm.tokens
    if mode == "seq_mean":
        return (xm.sum(-1) / mask.sum(-1).clamp(min=1)).sum() / norm.seqs
    if mode == "fixed_horizon":
        if not norm.horizon:
            raise ConfigError("loss.aggregation=fixed_horizon needs loss.horizon; set it to generator.max_tokens")
        return xm.sum() / (norm.seqs * norm.horizon)
    raise ConfigError(f"unknown loss.aggregation={mode!r}; use token_mean, seq_mean or fixed_horizon")


def _check(inp: LossInputs, needed: set[str], name: str) -> Norm:
    shape = tuple(inp.logprobs.shape)
    if len(shape) != 2:
        raise ValueError(f"LossInputs.logprobs must be [B, T], got shape {shape}")
    for key in ("old_logprobs", "mask", "ref_logprobs", "prox_logprobs", "entropy"):
        t = getattr(inp, key)
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"LossInputs.{key} has shape {tuple(t.shape)}; it must match logprobs {shape}")
    if tuple(inp.advantages.shape) != shape[:1]:
        raise ValueError(f"LossInputs.advantages must be [B]={shape[:1]}, got {tuple(inp.advantages.shape)}")
    for key in sorted(needed):
        if getattr(inp, key) is None:
            raise ValueError(f"loss {name!r} with this config needs LossInputs.{key}; see loss_requirements(cfg)")
    local_tokens = float(inp.mask.sum())
    tokens = inp.total_tokens or local_tokens
    seqs = inp.total_seqs or float(shape[0])
    if tokens + 1e-6 < local_tokens or seqs < shape[0]:
        raise ValueError(
            f"total_tokens={inp.total_tokens}/total_seqs={inp.total_seqs} are smaller than this micro-batch "
            f"({local_tokens} tokens, {shape[0]} seqs); pass the sums over the whole global batch"
        )
    return Norm(tokens=max(tokens, 1.0), seqs=seqs, horizon=None)


def run(cfg: LossConfig, inp: LossInputs, obj: Objective) -> tuple[torch.Tensor, dict[str, float]]:
    norm = _check(inp, loss_requirements(cfg), obj.name)
    norm = Norm(norm.tokens, norm.seqs, cfg.horizon)
    mask = inp.mask.to(inp.logprobs.dtype)
    terms: Terms = obj.fn(cfg, corrections.objective_inputs(cfg, obj, inp))
    fixes: dict[str, torch.Tensor] = {}
    if corrections.enabled(cfg):
        factor, fixes = corrections.correction(cfg, inp, obj)
        terms.loss = terms.loss * factor

    def token_mean(x: torch.Tensor) -> torch.Tensor:
        return (x.detach().to(mask.dtype) * mask).sum() / norm.tokens

    pg = aggregate(terms.loss, mask, cfg.aggregation, norm)
    total = pg
    stats = {
        "pg_loss": pg.detach(),
        "clip_frac_low": token_mean(terms.clip_low),
        "clip_frac_high": token_mean(terms.clip_high),
        "ratio_mean": token_mean(terms.ratio),
        "abs_log_ratio_mean": token_mean((inp.logprobs - inp.old_logprobs).abs()),
    }
    stats.update({k: token_mean(v) for k, v in terms.extra.items()})
    stats.update({k: token_mean(v) for k, v in fixes.items()})
    if inp.ref_logprobs is not None:
        kl = kl_estimate(inp.logprobs, inp.ref_logprobs, cfg.kl_estimator, cfg.log_ratio_clamp)
        stats["kl"] = token_mean(kl)
        if cfg.kl_beta > 0:
            total = total + cfg.kl_beta * aggregate(kl, mask, cfg.aggregation, norm)
    if inp.entropy is not None:
        stats["entropy"] = token_mean(inp.entropy)
        if cfg.entropy_coef > 0:
            total = total - cfg.entropy_coef * aggregate(inp.entropy, mask, cfg.aggregation, norm)
    stats["loss"] = total.detach()
    names = list(stats)
    values = torch.stack([stats[k].double() for k in names]).tolist()  # one device sync
    return total * inp.dp_world_size, dict(zip(names, values))
