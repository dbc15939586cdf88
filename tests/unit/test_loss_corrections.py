"""IcePop, sequence-level masked IS and the TIS caps (streamrl/losses/corrections.py) on every
objective, against a per-token loop written from the papers' definitions.

    pytest tests/unit/test_loss_corrections.py -q

The loop reuses the objectives' own reference (tests/unit/test_loss_objectives.py) and multiplies
each token's loss value and Jacobian row by the correction computed with Python floats, so the
vectorised masks, products and caps are checked independently of streamrl/losses/corrections.py.
With an importance weight on (IcePop, a TIS cap) the objective is run decoupled: its reference is
evaluated with pi_b := pi_old (ratio 1) and the weight in k = pi_old / pi_b multiplies it.
"""

from __future__ import annotations

import math

import pytest
import torch

from streamrl.core.errors import ConfigError
from streamrl.losses import LossInputs, compute_loss, get_objective
from tests.unit.test_loss_objectives import ADV, CASES, HORIZON, LOG_RATIO, make_batch, make_cfg, reference_sequence

# Against LOG_RATIO: IcePop drops exp(-0.6) and exp(1.2); the band of geometric means drops
# sequences 2 (mean log r 0.2625) and 3 (-0.45); the token cap bounds r = exp(0.3..0.4); the
# sequence cap bounds the products exp(0.65) and exp(1.05).
FIXES = {
    "icepop": dict(icepop_low=0.6, icepop_high=2.0),
    "seq_mis": dict(seq_mis_low=math.exp(-0.3), seq_mis_high=math.exp(0.25)),
    "tis_token": dict(tis_token_cap=1.3),
    "tis_seq": dict(tis_seq_cap=1.5),
}
FIXES["all"] = {k: v for name, d in FIXES.items() if name != "tis_seq" for k, v in d.items()}
FIXES["icepop_tis_seq"] = {**FIXES["icepop"], **FIXES["tis_seq"]}


def weighted(cfg):
    if get_objective(cfg.name).weights_behaviour:
        return False
    return any(getattr(cfg, k) is not None for k in ("icepop_low", "tis_token_cap", "tis_seq_cap"))


def factor(cfg, lrs):
    """The per-token weight of one sequence, from the definitions."""
    n = len(lrs)
    geo, prod = math.exp(sum(lrs) / n), math.exp(sum(lrs))
    keep_seq = 1.0
    if cfg.seq_mis_low is not None and not (cfg.seq_mis_low <= geo <= cfg.seq_mis_high):
        keep_seq = 0.0
    out = []
    for x in lrs:
        r = math.exp(x)
        keep = 1.0 if cfg.icepop_low is None or cfg.icepop_low <= r <= cfg.icepop_high else 0.0
        w = 1.0
        if weighted(cfg):  # one importance weight: the sequence's, else the token's (truncated)
            w = min(prod, cfg.tis_seq_cap) if cfg.tis_seq_cap is not None else min(r, cfg.tis_token_cap or math.inf)
        out.append(keep * w * keep_seq)
    return out


def reference(cfg, seqs):
    total_tokens, total_seqs = sum(len(s[0]) for s in seqs), len(seqs)
    value, grads = 0.0, []
    for b, (l, lb, lprox, a) in enumerate(seqs):
        n = len(l)
        weight = {"token_mean": 1 / total_tokens, "seq_mean": 1 / (n * total_seqs)}.get(
            cfg.aggregation, 1 / (total_seqs * HORIZON)
        )
        f = factor(cfg, LOG_RATIO[b])
        v, J = reference_sequence(cfg, l, l if weighted(cfg) else lb, lprox, a)
        value += weight * sum(f[t] * v[t] for t in range(n))
        grads.append([weight * sum(f[t] * J[t][k] for t in range(n)) for k in range(n)])
    return value, grads


@pytest.mark.parametrize("fix", list(FIXES))
@pytest.mark.parametrize("name,agg", CASES)
def test_corrections_match_reference_on_every_objective(name, agg, fix):
    if name in ("tis", "decoupled_ppo") and ("tis_token_cap" in FIXES[fix] or "tis_seq_cap" in FIXES[fix]):
        with pytest.raises(ConfigError, match="would weight it twice"):
            make_cfg(name, agg, **FIXES[fix])
        return
    cfg = make_cfg(name, agg, **FIXES[fix])
    l, lb, lprox, mask, seqs = make_batch()
    l.requires_grad_(True)
    loss, metrics = compute_loss(
        cfg, LossInputs(l, lb, torch.tensor(ADV, dtype=torch.float64), mask, prox_logprobs=lprox)
    )
    loss.backward()
    want, want_grad = reference(cfg, seqs)
    assert loss.item() == pytest.approx(want, rel=1e-10, abs=1e-12)
    for b, g in enumerate(want_grad):
        n = len(g)
        assert l.grad[b, :n].tolist() == pytest.approx(g, rel=1e-9, abs=1e-12)
        assert l.grad[b, n:].abs().sum().item() == 0.0  # padding's garbage ratio never leaks in


def test_correction_metrics_count_what_they_touch():
    cfg = make_cfg("grpo", "token_mean", **FIXES["all"])
    l, lb, _, mask, _ = make_batch()
    _, m = compute_loss(cfg, LossInputs(l, lb, torch.tensor(ADV, dtype=torch.float64), mask))
    ntok = sum(len(x) for x in LOG_RATIO)
    assert m["icepop_masked_frac"] == pytest.approx(2 / ntok)
    assert m["tis_token_capped_frac"] == pytest.approx(4 / ntok)  # exp(0.3), exp(0.35), exp(0.4), exp(1.2)
    assert m["seq_mis_masked_frac"] == pytest.approx((4 + 2) / ntok)  # sequences 2 and 3, per token
    flat = [x for lrs in LOG_RATIO for x in lrs]
    assert m["is_weight_mean"] == pytest.approx(sum(min(math.exp(x), 1.3) for x in flat) / ntok)
    _, m = compute_loss(
        make_cfg("grpo", "token_mean", **FIXES["tis_seq"]),
        LossInputs(l, lb, torch.tensor(ADV, dtype=torch.float64), mask),
    )
    assert m["tis_seq_capped_frac"] == pytest.approx((3 + 4) / ntok)  # sequences 1 and 2


def test_corrections_off_by_default_add_no_metrics():
    l, lb, _, mask, _ = make_batch()
    _, m = compute_loss(make_cfg("grpo", "token_mean"), LossInputs(l, lb, torch.tensor(ADV, dtype=torch.float64), mask))
    assert "pg_loss" in m
    assert not any(k.startswith(("icepop", "seq_mis", "tis_token", "tis_seq")) for k in m)
