"""The failure streak's time bound (issue 43): failures that each take a timeout (a hung env step)
stop the job after one timeout more of nothing but failures, not after a count that scales with it."""

import pytest

from streamrl.assemble.failure_streak import FailureStreak
from streamrl.config.files import load_config
from streamrl.core.errors import FatalError

HUNG = "episode g3:7:e727c641 turn 0: env step timed out after 10s in my_envs:Calc (env.step_timeout_s)"


def streak(*sets: str) -> FailureStreak:
    base = [
        "env.fn=my_envs:Calc",
        "env.step_timeout_s=10",
        "rollout.groups_per_step=4",
        "generator.max_inflight_groups=8",
    ]
    return FailureStreak(load_config(None, [*base, *sets]))


def test_hung_env_stops_after_one_more_timeout_of_failures_with_one_readable_cause():
    s = streak()
    s.step = 5
    for _ in range(8):  # the first round of in-flight groups times out at once
        s.failed(HUNG, now=100.0)
    s.step = 6  # a step trained from groups already complete: the message names the streak's start
    with pytest.raises(FatalError) as info:
        s.failed(HUNG, now=110.5)  # the next round timed out too
    msg = str(info.value)
    assert msg.startswith(
        "env step timed out after 10s in my_envs:Calc (env.step_timeout_s) (episode g3:7:e727c641, turn 0): "
        "every group since step 5 failed (9 groups in 10s, none completed; env.step_timeout_s=10); "
        "raise env.step_timeout_s or fix the env (env.fn=my_envs:Calc)"
    ), msg


RAISED = "episode g1:0:ab turn 1: env raised RuntimeError: tool crashed"


def test_time_bound_set_for_any_cause_needs_a_steps_worth_of_failures_and_no_success_in_between():
    s = streak("rollout.max_failing_s=10")
    for t in (0.0, 20.0, 40.0):  # a flaky env's slow groups failing one by one: fewer than a step's 4
        s.failed(RAISED, now=t)
    s.ok()  # a group completed: a new streak
    for t in (50.0, 51.0, 52.0, 59.0):
        s.failed(RAISED, now=t)
    with pytest.raises(FatalError):
        s.failed(RAISED, now=60.0)


def test_timeouts_alone_need_only_two_rounds():
    """Env workers that take fewer steps at once than a group has episodes fail one group per timeout
    (a group's steps queue together): two groups a timeout apart are the signal."""
    s = streak()
    s.failed(HUNG, now=0.0)
    with pytest.raises(FatalError, match="every group since step 0 failed \\(2 groups in 10s"):
        s.failed(HUNG, now=10.0)
    s = streak()
    s.failed(HUNG, now=0.0)
    s.failed(RAISED, now=10.0)  # not only timeouts: by default only the count bounds the streak
    for t in range(11, 108):  # a flaky env failing more than half its groups (one episode in 10)
        s.failed(RAISED, now=float(t))
    with pytest.raises(FatalError, match="100 groups in a row failed"):
        s.failed(RAISED, now=108.0)


def test_time_bound_off_without_env_and_set_explicitly_for_any_cause():
    s = FailureStreak(load_config(None, ["rollout.groups_per_step=2"]))
    assert s.window_s is None
    for t in range(50):  # only the count (100) applies
        s.failed("reward: reward function raised ValueError: x", now=float(t * 100))
    s = FailureStreak(load_config(None, ["rollout.groups_per_step=2", "rollout.max_failing_s=30", "reward.fn=m:f"]))
    s.failed("reward: reward function raised ValueError: x", now=0.0)
    s.failed("reward: reward function raised ValueError: x", now=29.0)
    with pytest.raises(
        FatalError, match=r"every group since step 0 failed .*fix the reward function \(reward.fn=m:f\)"
    ):
        s.failed("reward: reward function raised ValueError: x", now=30.0)


def test_count_bound_names_the_env_fix():
    s = streak("rollout.max_consecutive_failed_groups=2", "rollout.max_failing_s=1000")
    s.failed("episode e:0:a turn 1: env raised RuntimeError: boom", now=0.0)
    with pytest.raises(FatalError, match=r"2 groups in a row failed .*To go on, fix the env \(env.fn=my_envs:Calc\)"):
        s.failed("episode e:0:b turn 1: env raised RuntimeError: boom", now=0.0)


def test_the_env_workers_and_the_generators_records_of_one_hang_are_one_console_cause():
    from streamrl.launch.failures import FailureCounts

    counts = FailureCounts()
    for reason in (HUNG, HUNG.replace("g3:7:e727c641", "g4:1:0badf00d"), HUNG.replace("turn 0", "turn 3")):
        counts.add({"reason": reason, "worker": "env-0", "stream": "env_steps"})
        counts.add({"reason": reason, "worker": "generator-0", "stream": "prompts"})  # its group, failed
    assert list(counts.by_cause) == [
        "episode <id> turn N: env step timed out after 10s in my_envs:Calc (env.step_timeout_s)"
    ]
