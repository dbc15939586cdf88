"""`streamrl bench peers`' figures from a TRL job's step clock, and the ratio line (bench/peers.py).

pytest tests/unit/test_bench_peers.py
"""

from __future__ import annotations

import pytest

from bench.peers import ratios, trl_figures


def test_steady_figures_span_an_even_number_of_steps_after_the_first():
    # Off-policy TRL alternates a generating step (3 s) and a training-only step (1 s); step 1 waits for start-up.
    steps = [{"step": 1, "t": 50.0, "tokens": 32768}]
    for i in range(2, 8):  # steps 2..7: 6 steps after the first
        steps.append({"step": i, "t": steps[-1]["t"] + (3.0 if i % 2 == 0 else 1.0), "tokens": 32768})
    steps.append({"step": 8, "t": steps[-1]["t"] + 3.0, "tokens": 32768})  # a 7th: left out (odd count)
    f = trl_figures(steps)
    assert f["first_step_s"] == 50.0
    assert f["s_per_step"] == pytest.approx(2.0)  # (3 + 1) / 2, not skewed by the extra generating step
    assert f["trained_tok_s"] == pytest.approx(6 * 32768 / 12.0, rel=1e-3)
    assert f["steps"] == 8


def test_too_few_steps_is_an_error_not_a_rate():
    with pytest.raises(RuntimeError, match="at least 3"):
        trl_figures([{"step": 1, "t": 1.0, "tokens": 10}, {"step": 2, "t": 2.0, "tokens": 10}])


def test_ratio_is_streamrls_shipped_job_over_each_trl_variant():
    rows = [
        {"job": "streamrl async (max_staleness 1)", "trained_tok_s": 15000.0},
        {"job": "streamrl sync (max_staleness 0)", "trained_tok_s": 11000.0},
        {"job": "trl default", "trained_tok_s": 5000.0},
        {"job": "trl matched", "trained_tok_s": 7500.0},
    ]
    assert ratios(rows) == [
        "streamrl (shipped) / trl default: 3.00x trained tokens/s",
        "streamrl (shipped) / trl matched: 2.00x trained tokens/s",
    ]
