"""Failure bookkeeping without I/O: the failed-group streak, dead-letter causes, reward.on_error in the join."""

import numpy as np
import pytest

from streamrl.assemble.failure_streak import FailureStreak
from streamrl.assemble.join_policy import JoinPolicy
from streamrl.config.files import load_config
from streamrl.core.errors import FatalError
from streamrl.core.messages import Annotation
from streamrl.launch.failures import FailureCounts, cause, parse_record


def test_streak_raises_at_the_bound_with_the_first_error_and_resets():
    streak = FailureStreak(load_config(None, ["rollout.max_consecutive_failed_groups=3", "reward.fn=pkg.mod:score"]))
    streak.failed("reward: reward function raised KeyError: 'x'")
    streak.failed("reward: other")
    streak.ok()
    streak.failed("reward: reward function returned nan")
    streak.failed("reward: b")
    with pytest.raises(FatalError) as info:
        streak.failed("reward: c")
    msg = str(info.value)
    assert "3 groups in a row failed" in msg and "the first one: reward: reward function returned nan" in msg
    assert "reward.fn=pkg.mod:score" in msg and "reward.on_error=score" in msg


def test_streak_bound_none_never_stops():
    streak = FailureStreak(load_config(None, ["rollout.max_consecutive_failed_groups=null"]))
    for _ in range(10_000):
        streak.failed("reward: x")
    assert streak.count == 10_000


def test_dead_letter_causes_and_first_record():
    counts = FailureCounts()
    for reason in [
        "reward function raised ValueError: boom",
        "reward function returned nan",
        "reward function raised ValueError: other",
    ]:
        counts.add(parse_record(f'{{"reason": "{reason}", "worker": "reward-0", "stream": "s"}}\n'.encode() + b"\xff"))
    counts.add(parse_record(b"not json"))
    line = counts.line()
    assert (
        "4 entries" in line
        and "reward function raised ValueError: 2" in line
        and "reward function returned nan: 1" in line
    )
    assert "first: reward function raised ValueError: boom [reward-0, s]" in line
    assert cause("token ids outside the vocabulary [0, 5)") == "token ids outside the vocabulary [0, 5)"


def test_reward_on_error_score_uses_error_value_and_drop_fails():
    failed = Annotation(rollout_id="g0:0", key="reward", value=0.0, error="reward function returned nan")
    score = JoinPolicy(load_config(None, ["reward.on_error=score", "reward.error_value=-0.5"]))
    assert score.on_error("reward") == "default" and score.on_error("ref_logprobs") == "fail"
    np.testing.assert_allclose(score.components([{"reward": failed}])["reward"], [-0.5])
    drop = JoinPolicy(load_config(None, []))
    assert drop.on_error("reward") == "fail"
