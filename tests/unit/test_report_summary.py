"""streamrl report's pure parts: the optimisation in the summary and throughput.png's rolling rate,
which no longer swings with each step's wait (pure).

    pytest tests/unit/test_report_summary.py -q
"""

from __future__ import annotations

import numpy as np

from streamrl.report.figures import rolling_rate
from streamrl.report.summary import loss_summary


def test_summary_has_first_and_last_loss_kl_entropy_grad_norm():
    rows = [{"loss": 0.5, "kl": 0.001, "grad_norm": 2.0}, {"loss": 0.25, "kl": 0.004, "grad_norm": 1.0}]
    assert loss_summary(rows) == {"loss": "0.5 -> 0.25", "kl": "0.001 -> 0.004", "grad_norm": "2 -> 1"}
    assert loss_summary([{"reward_mean": 1.0}]) == {}


def test_rolling_rate_is_tokens_over_wall_time_of_the_window():
    tokens = [1000, 1000, 1000, 1000, 1000, 1000]
    walls = [1.0, 0.04, 1.0, 0.04, 1.0, 0.04]  # per step: 1k then 25k tok/s, alternating
    rate = rolling_rate(tokens, walls, window=2)
    np.testing.assert_allclose(rate[1:], 2000 / 1.04)  # every window holds one slow and one fast step
    assert rate[0] == 1000.0
