"""A hung environment (issue 43): `env.fn` whose step never returns stops the job by itself within
2 x env.step_timeout_s + 30 s of its first env step, with one readable cause on the console, in the
trainer's stop line and in summary.json; the roles' stop after it is quick (the generator does not wait
generator.drain_timeout_s for episodes whose env steps hang, the env worker does not wait for them).

    pytest tests/e2e/test_env_hang.py
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime

import pytest

from bench.jobs import Job, summary

pytestmark = pytest.mark.slow

STEP_TIMEOUT_S = 4
HANG = "tests.programs.env_fns:Hang"
CAUSE = f"env step timed out after {STEP_TIMEOUT_S}s in {HANG} (env.step_timeout_s)"


def _first(log, event: str) -> float:
    """When a role first logged `event` (its JSON log), as time.time()."""
    rows = [json.loads(ln) for ln in log.read_text().splitlines() if ln.startswith("{")]
    stamp = next(r["timestamp"] for r in rows if r.get("event") == event)
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@pytest.mark.timeout(400)
def test_a_hung_env_stops_the_job_in_time_with_one_readable_cause(tmp_path):
    run_dir = tmp_path / "hang"
    job = Job(
        run_dir,
        "run.export=false",
        f"env.fn={HANG}",
        f"env.step_timeout_s={STEP_TIMEOUT_S}",
        "env.concurrency=8",  # fewer than the episodes in flight: steps also wait behind hung ones
        "generator.drain_timeout_s=30",  # the default, which a stop used to wait out
        config="tiny-multiturn-cpu.yaml",
    )
    try:
        job.wait_output("generator-0 ready", timeout=300)
        ready = time.time()
        code = job.wait(timeout=2 * STEP_TIMEOUT_S + 90)
        ended = time.time()
    finally:
        job.stop()
    out = job.output()
    logs = run_dir / "logs"
    # The first env step began a step timeout before the env worker dead-lettered it.
    first_step = _first(logs / "env-0.jsonl", "dead_letter") - STEP_TIMEOUT_S
    took, stop_s = ended - first_step, ended - _first(logs / "trainer-0.jsonl", "stopped")
    print(
        f"first env step -> job ended: {took:.1f}s (bound {2 * STEP_TIMEOUT_S + 30}s); roles' stop {stop_s:.1f}s; "
        f"generator ready -> job ended {ended - ready:.1f}s"
    )
    assert code == 1, out[-3000:]
    assert took <= 2 * STEP_TIMEOUT_S + 30, out[-3000:]
    assert stop_s < 15, out[-3000:]  # the generator's drain would have waited 30 s
    stopped = next(ln for ln in out.splitlines() if "trainer-0 (trainer) stopped: " in ln)
    assert f"stopped: {CAUSE} (episode " in stopped and ", turn 0): every group since step 0 failed (" in stopped
    assert "raise env.step_timeout_s or fix the env (env.fn=tests.programs.env_fns:Hang)" in stopped
    failures = [ln for ln in out.splitlines() if ln.startswith("failures: ")]
    one_cause = re.compile(
        rf"failures: [\d,]+ entries dead-lettered \(episode <id> turn N: {re.escape(CAUSE)}: [\d,]+\); first: "
    )
    assert failures and all(one_cause.match(ln) for ln in failures), failures  # the env's and the generator's records
    assert CAUSE in summary(run_dir)["stop_reason"]
