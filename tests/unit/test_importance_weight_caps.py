"""The TIS caps and IcePop weight a token by the paper's importance weight on every objective,
checked from first principles (no reference loop shared with the code).

    pytest tests/unit/test_importance_weight_caps.py -q

Truncated IS (Ionides 2008; Yao et al. 2025): a token sampled by pi_b and trained at pi_old, with
k = pi_old / pi_b, gets the REINFORCE gradient -A dl scaled by min(k, C). One token at k = 4,
A = -1, C = 2 therefore has |dL/dl| = 2 whatever the objective (each objective's gradient at its
own ratio 1 is the on-policy one). IcePop (Ring-1T report) scales it by M(k) = k 1[a <= k <= b].
"""

from __future__ import annotations

import math

import pytest
import torch

from streamrl.config.schema import LossConfig
from streamrl.core.errors import ConfigError
from streamrl.losses import LossInputs, compute_loss, loss_settings

WEIGHTED = ["grpo", "dr_grpo", "dapo", "gspo", "cispo", "sapo", "clipped_reinforce", "reinforce"]
"""Objectives that carry no truncated weight of their own: the shared caps apply to them."""


def grad(name, k, adv, aggregation=None, mask=None, **kw):
    """d loss / d l for log-ratios log(k) (any [B, T] shape) and per-sequence advantages."""
    k = torch.as_tensor(k, dtype=torch.float64).reshape(len(adv), -1)
    l = torch.log(torch.full_like(k, 0.3)).requires_grad_(True)
    lb = (l - torch.log(k)).detach()
    settings = dict(name=name, horizon=k.shape[1], **kw)
    if aggregation is not None:
        settings["aggregation"] = aggregation
    cfg = loss_settings(LossConfig(**settings))
    mask = torch.ones_like(k) if mask is None else mask
    inp = LossInputs(l, lb, torch.tensor(adv, dtype=torch.float64), mask, prox_logprobs=l.detach())
    loss, _ = compute_loss(cfg, inp)
    loss.backward()
    return l.grad, cfg


@pytest.mark.parametrize("cap", ["tis_token_cap", "tis_seq_cap"])
@pytest.mark.parametrize("name", WEIGHTED)
def test_one_token_at_k4_with_cap2_gets_weight_2(name, cap):
    g, _ = grad(name, [[4.0]], [-1.0], **{cap: 2.0})
    assert abs(g.item()) == pytest.approx(2.0, rel=1e-12)
    assert g.item() > 0  # A < 0: the loss pushes l down


@pytest.mark.parametrize("name,own", [("tis", "tis_cap"), ("decoupled_ppo", "behav_weight_cap")])
def test_objectives_with_their_own_cap_truncate_at_it_and_refuse_a_second(name, own):
    g, _ = grad(name, [[4.0]], [-1.0], **{own: 2.0})
    assert abs(g.item()) == pytest.approx(2.0, rel=1e-12)
    for cap in ("tis_token_cap", "tis_seq_cap"):
        with pytest.raises(ConfigError, match=f"loss.{own}"):
            grad(name, [[4.0]], [-1.0], **{cap: 2.0})


def test_both_caps_at_once_are_refused():
    with pytest.raises(ConfigError, match="keep one of them"):
        grad("grpo", [[4.0]], [-1.0], tis_token_cap=2.0, tis_seq_cap=2.0)


@pytest.mark.parametrize("cap", ["tis_token_cap", "tis_seq_cap"])
@pytest.mark.parametrize("name", WEIGHTED)
def test_weight_never_exceeds_the_cap_on_random_batches(name, cap):
    """|dL/dl| / |REINFORCE's dL/dl| (same aggregation) is the token's weight: min(k, C) <= C."""
    C = 2.0
    gen = torch.Generator().manual_seed(7)
    B, T = 16, 6
    k = torch.exp(1.2 * torch.randn(B, T, generator=gen, dtype=torch.float64))  # k up to ~e^4
    adv = (torch.rand(B, generator=gen, dtype=torch.float64) * 2 - 1).tolist()
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.float64)
    g, cfg = grad(name, k, adv, mask=mask, **{cap: C})
    base, _ = grad("reinforce", torch.ones(B, T), adv, aggregation=cfg.aggregation, mask=mask)
    on = mask.bool()
    weight = (g[on] / base[on]).tolist()
    if cap == "tis_token_cap" and name == "gspo":
        # one term per sequence: d s / d l_t = s / n spreads the sequence's weights evenly over it
        w = (k.clamp(max=C) * mask).sum(-1) / mask.sum(-1)
        want = w[:, None].expand(B, T)[on]
    elif cap == "tis_token_cap":
        want = k.clamp(max=C)[on]
    else:
        want = torch.exp((torch.log(k) * mask).sum(-1)).clamp(max=C)[:, None].expand(B, T)[on]
    assert max(weight) <= C + 1e-9
    assert weight == pytest.approx(want.tolist(), rel=1e-9)
    assert g[~on].abs().sum().item() == 0.0


@pytest.mark.parametrize("name", WEIGHTED)
def test_icepop_weights_by_k_inside_the_band_and_drops_outside(name):
    """The paper's M(k) = k for a <= k <= b, else 0, on every objective (its ratio at pi_old is 1)."""
    inside, _ = grad(name, [[1.5]], [1.0], icepop_low=0.5, icepop_high=2.0)
    assert abs(inside.item()) == pytest.approx(1.5, rel=1e-12)
    outside, _ = grad(name, [[4.0]], [1.0], icepop_low=0.5, icepop_high=2.0)
    assert outside.item() == 0.0


def test_icepop_with_a_token_cap_truncates_the_band_weight():
    g, _ = grad("reinforce", [[math.exp(1.0)]], [1.0], icepop_low=0.5, icepop_high=5.0, tis_token_cap=2.0)
    assert abs(g.item()) == pytest.approx(2.0, rel=1e-12)


def test_masks_alone_keep_the_objectives_ratio_against_the_sampler():
    """seq_mis is rejection only (no weight): grpo keeps r = pi / pi_b, so a kept token at k = 1.1 has
    gradient k A, and the clip against the sampler still bites at k = 1.5 (A > 0)."""
    kept, _ = grad("grpo", [[1.1]], [1.0], seq_mis_low=0.5, seq_mis_high=2.0)
    assert abs(kept.item()) == pytest.approx(1.1, rel=1e-12)
    clipped, _ = grad("grpo", [[1.5]], [1.0], seq_mis_low=0.5, seq_mis_high=2.0)
    assert clipped.item() == 0.0
