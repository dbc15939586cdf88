"""Admission rule and staleness helpers (pure)."""

import numpy as np

from streamrl.core.staleness import admission_budget, is_stale, staleness, staleness_histogram


def test_admission_follows_areal_rule():
    # (v + s + 1) * groups_per_step live groups at most.
    assert admission_budget(0, 0, version=0, max_staleness=0, groups_per_step=4) == 4
    assert admission_budget(4, 0, version=0, max_staleness=0, groups_per_step=4) == 0
    assert admission_budget(4, 0, version=1, max_staleness=0, groups_per_step=4) == 4
    assert admission_budget(0, 0, version=0, max_staleness=2, groups_per_step=4) == 12
    assert admission_budget(10, 0, version=0, max_staleness=2, groups_per_step=4) == 2


def test_released_groups_free_their_slots():
    assert admission_budget(8, 0, version=1, max_staleness=0, groups_per_step=4) == 0
    assert admission_budget(8, 3, version=1, max_staleness=0, groups_per_step=4) == 3


def test_total_caps_admission():
    assert admission_budget(0, 0, version=0, max_staleness=8, groups_per_step=4, total_groups=10) == 10
    assert admission_budget(10, 0, version=5, max_staleness=8, groups_per_step=4, total_groups=10) == 0
    assert admission_budget(10, 2, version=5, max_staleness=8, groups_per_step=4, total_groups=10) == 2


def test_never_negative():
    assert admission_budget(100, 0, version=0, max_staleness=0, groups_per_step=4) == 0


def test_staleness_and_bound():
    np.testing.assert_array_equal(staleness(5, [5, 4, 2]), [0, 1, 3])
    assert not is_stale(5, 4, max_staleness=1)
    assert is_stale(5, 3, max_staleness=1)
    assert not is_stale(0, 0, max_staleness=0)


def test_histogram_counts_and_weights():
    assert staleness_histogram([0, 1, 1, 2]) == {"0": 1, "1": 2, "2": 1}
    assert staleness_histogram([1, 0, 1], weights=[10, 5, 3]) == {"0": 5, "1": 13}
    assert list(staleness_histogram([3, 0, 10, 2])) == ["0", "2", "3", "10"]


def test_due_first_takes_the_oldest_and_keeps_arrival_order_among_equals():
    from streamrl.core.staleness import due_first

    assert due_first([2, 2, 1, 3, 1]) == [2, 4, 0, 1, 3]
    assert due_first([]) == []
