"""Group-relative advantages, DAPO dynamic sampling and overlong shaping (numpy, no I/O).

pytest tests/unit/test_advantages.py -q
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.assemble.advantages import batch_advantages, group_advantages, overlong_penalty
from streamrl.core.errors import ConfigError


def test_group_modes_by_hand():
    r = np.array([1.0, 0.0, 0.0, 1.0, 1.0])  # mean 0.6, sample std sqrt(0.3)
    assert group_advantages(r, "group_mean") == pytest.approx([0.4, -0.6, -0.6, 0.4, 0.4])
    sd = np.sqrt(0.3)
    assert group_advantages(r, "group_norm", eps=0.0) == pytest.approx(
        [0.4 / sd, -0.6 / sd, -0.6 / sd, 0.4 / sd, 0.4 / sd]
    )
    # leave-one-out: 1 - mean(0,0,1,1) = 0.5 ; 0 - mean(1,0,1,1) = -0.75
    assert group_advantages(r, "loo") == pytest.approx([0.5, -0.75, -0.75, 0.5, 0.5])


@pytest.mark.parametrize("mode", ["group_norm", "group_mean", "loo"])
def test_equal_rewards_and_singletons_give_zero(mode):
    assert group_advantages(np.full(4, 0.3), mode).tolist() == [0.0] * 4
    assert group_advantages(np.array([2.0]), mode).tolist() == [0.0]


def test_unknown_mode_names_the_fix():
    with pytest.raises(ConfigError, match="set loss.advantage to one of group_norm, group_mean, loo"):
        group_advantages(np.ones(2), "ppo")


def test_batch_handles_unsorted_group_ids():
    rewards = np.array([1.0, 5.0, 0.0, 7.0, 1.0, 6.0])
    groups = np.array([3, 9, 3, 9, 3, 9])
    adv = batch_advantages(rewards, groups, "group_mean")
    assert adv.dtype == np.float32
    assert adv == pytest.approx([1 / 3, -1.0, -2 / 3, 1.0, 1 / 3, 0.0], abs=1e-6)
    with pytest.raises(ValueError, match="one group id per reward"):
        batch_advantages(rewards, groups[:3], "loo")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.floats(-5, 5), min_size=2, max_size=6), min_size=1, max_size=5))
def test_batch_equals_per_group_and_centred(groups):
    rewards = np.concatenate([np.array(g) for g in groups])
    index = np.concatenate([np.full(len(g), i) for i, g in enumerate(groups)])
    for mode in ("group_norm", "group_mean", "loo"):
        adv = batch_advantages(rewards, index, mode)
        for i, g in enumerate(groups):
            per_group = group_advantages(np.array(g), mode)
            assert adv[index == i] == pytest.approx(per_group.astype(np.float32), rel=1e-5, abs=1e-5)
            assert abs(per_group.sum()) < 1e-6 * max(1.0, np.abs(per_group).max())  # every mode is centred
        # leave-one-out is group_mean scaled by n/(n-1)
        loo, gm = batch_advantages(rewards, index, "loo"), batch_advantages(rewards, index, "group_mean")
        n = np.array([len(groups[i]) for i in index])
        assert loo == pytest.approx(gm * n / (n - 1), rel=1e-5, abs=1e-5)


def test_overlong_penalty_ramp():
    got = overlong_penalty(np.array([10, 12, 14, 16, 20, 21]), max_tokens=20, buffer=8, penalty=0.5)
    # punishment interval (12, 20]: (12 - len) / 8 * 0.5, then -0.5 past 20
    assert got == pytest.approx([0.0, 0.0, -0.125, -0.25, -0.5, -0.5])
    assert overlong_penalty(np.array([20, 21]), 20, 0).tolist() == [0.0, -1.0]
    with pytest.raises(ConfigError, match="overlong_buffer"):
        overlong_penalty(np.array([1]), max_tokens=10, buffer=11)
