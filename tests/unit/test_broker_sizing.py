"""bench/broker_sizing.py: the projection's arithmetic."""

from __future__ import annotations

import pytest

from bench.broker_sizing import rollouts_needed, size_cluster


def test_rollouts_needed_is_generation_tokens_over_rollout_length():
    assert rollouts_needed(1000, 4096, 1024, gen_fraction=0.75) == pytest.approx(3000)


def test_cpu_bound_sizing():
    # 10,000 rollouts/s at 100 us of master CPU each = 1 core; at half a core per master: 2, then 3 (minimum).
    plan = size_cluster(10_000, 100e-6, 20e-6, rollout_bytes=1000, annotation_bytes=0)
    assert (plan.masters_for_cpu, plan.masters, plan.nodes, plan.partitions) == (2, 3, 6, 3)
    plan = size_cluster(40_000, 100e-6, 20e-6, rollout_bytes=1000, annotation_bytes=0)
    assert plan.masters == plan.masters_for_cpu == 8
    assert plan.master_core_frac == pytest.approx(0.5)


def test_network_bound_sizing():
    # 9 KB rollouts read by 3 groups + 1 replica, 4 KB annotations: (9000 * 5 + 4000 * 3) B = 57 KB per rollout.
    plan = size_cluster(100_000, 1e-6, 1e-6, rollout_bytes=9000, annotation_bytes=4000)
    assert plan.gbit_total == pytest.approx(100_000 * 57_000 * 8 / 1e9)
    assert plan.masters == plan.masters_for_network == 4  # 45.6 Gbit/s over 12.5 usable per NIC
