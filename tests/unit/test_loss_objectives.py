"""Every objective's value and gradient against a per-token loop written straight from its paper.

    pytest tests/unit/test_loss_objectives.py -q

The reference works on Python floats with hand-derived derivatives (no autograd), token by
token, so it is independent of the vectorised code; compute_loss runs in float64 on hand-made
tensors that hit every branch: padding with garbage values, clipped and unclipped tokens on
both sides, the dual clip, negative advantages, capped importance weights.
"""

from __future__ import annotations

import math

import pytest
import torch

from streamrl.config.schema import LossConfig
from streamrl.losses import LossInputs, compute_loss, get_objective, loss_settings

torch.set_num_threads(1)
SIG = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
ADV = [1.3, -0.8, 0.5, -2.0]
# log(r) = l - l_b on each sequence's real tokens; the rest of the row is padding
LOG_RATIO = [[-0.5, -0.1, 0.0, 0.1, 0.4], [-0.6, 0.05, 1.2], [0.3, 0.35, 0.25, 0.15], [-0.5, -0.4]]
# l - l_prox for decoupled_ppo: u outside [0.8, 1.2] on some tokens, and l_prox - l_b = 1.7 > log(cap=5)
# on the last token of sequence 0
PROX_GAP = [[0.3, -0.05, 0.0, -0.3, -1.3], [-0.3, 0.25, 0.05], [0.0, 0.1, -0.1, 2.0], [0.0, 0.3]]
T, PAD = 5, 100.0
HORIZON = 7


def _clip(x, lo, hi):
    return min(max(x, lo), hi)


def ppo_obj(r, a, el, eh, c=None):
    """PPO objective min(rA, clip(r)A) (dual: max(., cA) for A<0) and its derivative in r."""
    unclipped, clipped = r * a, _clip(r, 1 - el, 1 + eh) * a
    if unclipped <= clipped:
        obj, g = unclipped, a
    else:
        obj, g = clipped, (a if 1 - el < r < 1 + eh else 0.0)
    if c is not None and a < 0 and c * a > obj:
        obj, g = c * a, 0.0
    return obj, g


def reference_sequence(cfg, l, lb, lprox, a):
    """Per-token loss values v[t] and Jacobian J[t][t'] = dv[t]/dl[t'] of one sequence."""
    n = len(l)
    v, J = [0.0] * n, [[0.0] * n for _ in range(n)]
    if cfg.name == "gspo":
        s = math.exp(sum(l[t] - lb[t] for t in range(n)) / n)
        obj, g = ppo_obj(s, a, cfg.eps_low, cfg.eps_high)
        return [-obj] * n, [[-g * s / n] * n for _ in range(n)]
    for t in range(n):
        r = math.exp(l[t] - lb[t])
        if cfg.name in ("grpo", "dr_grpo", "dapo"):
            obj, g = ppo_obj(r, a, cfg.eps_low, cfg.eps_high, cfg.dual_clip_c)
            v[t], J[t][t] = -obj, -g * r
        elif cfg.name == "decoupled_ppo":
            u, w = math.exp(l[t] - lprox[t]), min(math.exp(lprox[t] - lb[t]), cfg.behav_weight_cap)
            obj, g = ppo_obj(u, a, cfg.eps_low, cfg.eps_high, cfg.dual_clip_c)
            v[t], J[t][t] = -w * obj, -w * g * u
        elif cfg.name == "cispo":
            w = _clip(r, 1 - cfg.eps_low, 1 + cfg.eps_high)
            v[t], J[t][t] = -w * a * l[t], -w * a
        elif cfg.name == "tis":
            w = min(r, cfg.tis_cap)
            v[t], J[t][t] = -w * a * l[t], -w * a
        elif cfg.name == "sapo":
            tau = cfg.sapo_tau_pos if a > 0 else cfg.sapo_tau_neg
            p = SIG(tau * (r - 1))
            v[t], J[t][t] = -(4 / tau) * p * a, -4 * p * (1 - p) * r * a
        elif cfg.name == "reinforce":
            v[t], J[t][t] = -a * l[t], -a
        elif cfg.name == "clipped_reinforce":
            keep = 1.0 if 1 - cfg.eps_low <= r <= 1 + cfg.eps_high else 0.0
            v[t], J[t][t] = -keep * a * l[t], -keep * a
        else:
            raise AssertionError(cfg.name)
    return v, J


def reference(cfg, seqs):
    """Aggregated loss and d loss / d l[b][t], looping over sequences and tokens."""
    total_tokens, total_seqs = sum(len(s[0]) for s in seqs), len(seqs)
    value, grads = 0.0, []
    for l, lb, lprox, a in seqs:
        n = len(l)
        weight = {
            "token_mean": 1 / total_tokens,
            "seq_mean": 1 / (n * total_seqs),
            "fixed_horizon": 1 / (total_seqs * HORIZON),
        }[cfg.aggregation]
        v, J = reference_sequence(cfg, l, lb, lprox, a)
        value += weight * sum(v)
        grads.append([weight * sum(J[t][k] for t in range(n)) for k in range(n)])
    return value, grads


def make_batch():
    B = len(ADV)
    l = torch.full((B, T), -30.0, dtype=torch.float64)
    lb = torch.full((B, T), -30.0 - PAD, dtype=torch.float64)  # garbage ratio e^100 on padding
    lprox = torch.full((B, T), 7.0, dtype=torch.float64)
    mask = torch.zeros(B, T, dtype=torch.float64)
    seqs = []
    for b, lrs in enumerate(LOG_RATIO):
        n = len(lrs)
        lv = [-1.0 - 0.3 * t - 0.1 * b for t in range(n)]
        lbv = [lv[t] - lrs[t] for t in range(n)]
        lpv = [lv[t] - PROX_GAP[b][t] for t in range(n)]
        l[b, :n], lb[b, :n], lprox[b, :n], mask[b, :n] = (
            torch.tensor(x, dtype=torch.float64) for x in (lv, lbv, lpv, [1.0] * n)
        )
        seqs.append((lv, lbv, lpv, ADV[b]))
    return l, lb, lprox, mask, seqs


CASES = [
    (name, agg)
    for name in ("grpo", "gspo", "cispo", "sapo", "tis", "decoupled_ppo", "clipped_reinforce", "reinforce")
    for agg in ("token_mean", "seq_mean", "fixed_horizon")
    if name != "gspo" or agg == "seq_mean"  # gspo is sequence-level: other aggregations are refused
] + [("dr_grpo", "fixed_horizon"), ("dapo", "token_mean")]


def make_cfg(name, agg, **kw):
    """The objective's settings (its own defaults for what is not given), as the trainer gets them."""
    base = dict(name=name, aggregation=agg, horizon=HORIZON)
    if "eps_low" in get_objective(name).settings.model_fields:
        base.update(eps_low=0.2, eps_high=0.2)
    if name in ("grpo", "decoupled_ppo", "dapo"):
        base["dual_clip_c"] = 3.0
    if name == "dr_grpo":
        base["advantage"] = "group_mean"
    return loss_settings(LossConfig(**{**base, **kw}))


@pytest.mark.parametrize("name,agg", CASES)
def test_value_and_gradient_match_reference(name, agg):
    cfg = make_cfg(name, agg)
    l, lb, lprox, mask, seqs = make_batch()
    l.requires_grad_(True)
    adv = torch.tensor(ADV, dtype=torch.float64)
    loss, metrics = compute_loss(cfg, LossInputs(l, lb, adv, mask, prox_logprobs=lprox))
    loss.backward()
    want, want_grad = reference(cfg, seqs)
    assert loss.item() == pytest.approx(want, rel=1e-10, abs=1e-12)
    assert metrics["loss"] == pytest.approx(want, rel=1e-10, abs=1e-12)
    for b, g in enumerate(want_grad):
        n = len(g)
        assert l.grad[b, :n].tolist() == pytest.approx(g, rel=1e-9, abs=1e-12)
        assert l.grad[b, n:].abs().sum().item() == 0.0  # padding never gets a gradient
    assert math.isfinite(metrics["ratio_mean"]) and math.isfinite(metrics["abs_log_ratio_mean"])
    if name == "decoupled_ppo":
        assert metrics["behav_capped_frac"] == pytest.approx(1 / 14)  # the truncation is exercised


def test_ppo_clip_fractions_and_ratio_metrics():
    cfg = make_cfg("grpo", "token_mean")
    l, lb, _, mask, seqs = make_batch()
    _, m = compute_loss(cfg, LossInputs(l, lb, torch.tensor(ADV, dtype=torch.float64), mask))
    ntok = sum(len(s[0]) for s in seqs)
    low = sum(1 for b, lrs in enumerate(LOG_RATIO) for x in lrs if ADV[b] < 0 and math.exp(x) < 0.8)
    high = sum(1 for b, lrs in enumerate(LOG_RATIO) for x in lrs if ADV[b] > 0 and math.exp(x) > 1.2)
    dual = sum(1 for b, lrs in enumerate(LOG_RATIO) for x in lrs if ADV[b] < 0 and math.exp(x) > 3.0)
    assert (low, high, dual) == (3, 4, 1)  # the hand-made batch hits every branch
    assert m["clip_frac_low"] == pytest.approx(low / ntok)
    assert m["clip_frac_high"] == pytest.approx(high / ntok)
    assert m["clip_frac_dual"] == pytest.approx(dual / ntok)
    flat = [x for lrs in LOG_RATIO for x in lrs]
    assert m["ratio_mean"] == pytest.approx(sum(math.exp(x) for x in flat) / ntok)
    assert m["abs_log_ratio_mean"] == pytest.approx(sum(abs(x) for x in flat) / ntok)


@pytest.mark.parametrize(
    "name", ["grpo", "gspo", "cispo", "sapo", "tis", "decoupled_ppo", "clipped_reinforce", "reinforce"]
)
def test_equal_rewards_give_zero_policy_gradient(name):
    from streamrl.assemble.advantages import batch_advantages

    adv = batch_advantages([0.7] * 4, [0, 0, 0, 0], "group_norm")
    assert adv.tolist() == [0.0] * 4
    l, lb, lprox, mask, _ = make_batch()
    l.requires_grad_(True)
    inp = LossInputs(l, lb, torch.tensor(adv, dtype=torch.float64), mask, prox_logprobs=lprox)
    loss, m = compute_loss(make_cfg(name, "seq_mean" if name == "gspo" else "token_mean"), inp)
    loss.backward()
    assert l.grad.abs().max().item() == 0.0 and m["pg_loss"] == 0.0


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_and_entropy_terms_match_reference(kind):
    beta, coef = 0.3, 0.05
    cfg = make_cfg("grpo", "seq_mean", kl_beta=beta, kl_estimator=kind, entropy_coef=coef)
    l, lb, _, mask, seqs = make_batch()
    ref = l.detach() - 0.2 * torch.arange(T, dtype=torch.float64) + 0.1  # l_ref - l in [-0.7, 0.1]
    ent = torch.rand(l.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    l.requires_grad_(True), ent.requires_grad_(True)
    inp = LossInputs(l, lb, torch.tensor(ADV, dtype=torch.float64), mask, ref_logprobs=ref, entropy=ent)
    loss, m = compute_loss(cfg, inp)
    loss.backward()
    pg, pg_grad = reference(cfg, seqs)
    value, kl_sum, ntok = pg, 0.0, 0
    for b, (lv, *_rest) in enumerate(seqs):
        n, w = len(lv), 1 / (len(lv) * len(seqs))
        for t in range(n):
            d = ref[b, t].item() - lv[t]  # log(ref / pi)
            k, dk = {"k1": (-d, 1.0), "k2": (0.5 * d * d, -d), "k3": (math.exp(d) - d - 1, 1 - math.exp(d))}[kind]
            value += w * (beta * k - coef * ent[b, t].item())
            kl_sum, ntok = kl_sum + k, ntok + 1
            assert l.grad[b, t].item() == pytest.approx(pg_grad[b][t] + w * beta * dk, rel=1e-9, abs=1e-12)
            assert ent.grad[b, t].item() == pytest.approx(-w * coef)
    assert loss.item() == pytest.approx(value, rel=1e-10)
    assert m["pg_loss"] == pytest.approx(pg, rel=1e-10)
    assert m["kl"] == pytest.approx(kl_sum / ntok, rel=1e-10)
    assert m["entropy"] == pytest.approx((ent.detach() * mask).sum().item() / ntok)


def test_log_ratio_clamp_bounds_the_ratio():
    cfg = make_cfg("grpo", "token_mean", log_ratio_clamp=2.0)
    l = torch.tensor([[0.0, 0.0]], dtype=torch.float64)
    lb = torch.tensor([[-50.0, 50.0]], dtype=torch.float64)
    _, m = compute_loss(cfg, LossInputs(l, lb, torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 2)))
    assert m["ratio_mean"] == pytest.approx((math.exp(2.0) + math.exp(-2.0)) / 2)
