"""The step's mismatch metrics (streamrl/train/mismatch.py) against a numpy reference.

    pytest tests/unit/test_mismatch.py -q

Two micro-batches with padding holding garbage log-probs and rows of staleness 0 and > 0; the
reference lists the real tokens' ratios per group by a Python loop and applies the definitions.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streamrl.train.mismatch import MismatchMeter, mismatch_metrics


def micro_batch(rng, lengths, T=6):
    B = len(lengths)
    logp = torch.tensor(rng.normal(-2, 1, (B, T)))
    old = logp + torch.tensor(rng.normal(0, 0.3, (B, T)))
    mask = torch.zeros(B, T, dtype=torch.float64)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
        old[b, n:] = -500.0  # padding: a garbage ratio that must not count
    return logp, old, mask


def test_metrics_match_numpy_reference():
    rng = np.random.default_rng(0)
    meter, ratios = MismatchMeter(), {"s0": [], "stale": []}
    for lengths, staleness in (([3, 6, 1], [0, 2, 0]), ([5, 2], [1, 0])):
        logp, old, mask = micro_batch(rng, lengths)
        meter.add(logp, old, mask, np.array(staleness))
        for b, n in enumerate(lengths):
            group = "stale" if staleness[b] > 0 else "s0"
            ratios[group] += [float(np.exp(logp[b, t].item() - old[b, t].item())) for t in range(n)]
    got = mismatch_metrics(*meter.local())
    for g, w in ratios.items():
        w = np.array(w)
        assert got[f"mismatch_tokens_{g}"] == len(w)
        assert got[f"mismatch_kl_{g}"] == pytest.approx(np.mean(w - 1 - np.log(w)), rel=1e-12)
        assert got[f"mismatch_ess_{g}"] == pytest.approx(w.sum() ** 2 / (len(w) * (w**2).sum()), rel=1e-12)
        assert got[f"mismatch_ratio_max_{g}"] == pytest.approx(w.max(), rel=1e-12)
        assert got[f"mismatch_ratio_p99_{g}"] == pytest.approx(np.percentile(w, 99), rel=1e-12)


def test_a_group_without_tokens_has_no_keys():
    rng = np.random.default_rng(1)
    meter = MismatchMeter()
    meter.add(*micro_batch(rng, [4, 2]), np.zeros(2))
    got = mismatch_metrics(*meter.local())
    assert got["mismatch_tokens_s0"] == 6 and not any(k.endswith("_stale") for k in got)
