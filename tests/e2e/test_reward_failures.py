"""`streamrl up` with a failing reward function: an always-failing one stops the job with its error
after rollout.max_consecutive_failed_groups, and the console counts failures per cause. (A flaky one
with reward.on_error=score, which trains instead of discarding its groups, is test_run_dirs' job b.)

    pytest tests/e2e/test_reward_failures.py
"""

import subprocess
import time
from pathlib import Path

import pytest

from bench import jobs

pytestmark = pytest.mark.slow


def up(run_dir: Path, *sets: str, timeout: int = 300) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    res = jobs.up(run_dir, "loss.kl_beta=0", "rollout.groups_per_step=4", "run.export=false", *sets, timeout=timeout)
    return res, time.monotonic() - t0


FIRST = {  # each failure's cause (the console's count) -> its reason (the first one's text)
    "reward function raised ValueError": "reward function raised ValueError: grader unavailable",
    "reward function returned nan": "reward function returned nan",
}


@pytest.mark.timeout(400)
def test_always_failing_reward_stops_the_job_with_its_error(tmp_path):
    """One job for both kinds of failure (a job of its own each cost a job's start-up): the reward
    function raises on some completions and returns NaN on the others."""
    res, took = up(
        tmp_path / "run",
        "reward.fn=tests.programs.reward_fns:raise_or_nan",
        "rollout.max_consecutive_failed_groups=12",
        "trainer.steps=3",
    )
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    assert "trainer-0 (trainer) stopped: nothing can be trained: 12 groups in a row failed" in out, out[-3000:]
    assert any(f"the first one: reward: {first}" in out for first in FIRST.values()), out[-3000:]
    assert "reward.on_error=score" in out, out[-3000:]
    failures = [ln for ln in res.stdout.splitlines() if ln.startswith("failures: ")]
    assert failures, res.stdout[-3000:]
    for cause in FIRST:  # counted per cause
        assert f"({cause}: " in failures[-1] or f", {cause}: " in failures[-1], failures[-1]
    assert any(f"first: {first} [reward-0, " in failures[-1] for first in FIRST.values()), failures[-1]
    assert "restarting" not in out
    print(f"stopped after {took:.1f}s; {failures[-1]}")
