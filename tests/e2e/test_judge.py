"""The judge job end to end (`streamrl up` on configs/tiny-judge-cpu.yaml, real processes, a real
redis-server, real vLLM CPU engines): a second judge joins with `streamrl scale judge=2`, `streamrl
status` shows the judge group's lag, judge-0 is SIGKILLed mid-run (restarted; its pending rollouts are
taken over), and the run ends with the accounting exact and the judges' scores as the trained reward.

    pytest tests/e2e/test_judge.py
"""

from __future__ import annotations

import json
import re

import pytest

from bench.jobs import QUICK_RECOVERY, Job, assert_exact, log_events, run_cli
from tests.e2e.hold import held, wait_held, worker_pid

pytestmark = pytest.mark.slow
RUN, STEPS = "judge-e2e", 8


def cli(up: Job, *args: str) -> str:
    res = run_cli(*args, "--run-dir", str(up.run_dir))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return res.stdout


@pytest.mark.timeout(900)
def test_judge_job_survives_a_sigkilled_judge_and_trains_on_its_scores(tmp_path):
    up = Job(
        tmp_path / "run", f"run.name={RUN}", f"trainer.steps={STEPS}", *QUICK_RECOVERY, config="tiny-judge-cpu.yaml"
    )
    up.wait_broker()  # `up` is live: its scale file is read
    cli(up, "scale", "judge=2")  # at once, so judge-1's engine starts while judge-0's does
    # The trainer held (SIGSTOP) from its start while status runs and judge-0 is killed: once the judges
    # score, the tiny job takes its steps in well under a second each, so a check started after step N
    # can find the job over (seen in CI). The judges score the admitted groups while the trainer waits.
    with up.redis() as r:
        up.wait_for("the trainer's heartbeat", lambda: r.exists(f"streamrl:{RUN}:workers:trainer:trainer-0"), 300)
        trainer = worker_pid(r, RUN, "trainer", "trainer-0")
        with held(trainer):

            def scoring() -> bool:
                raw = r.get(f"streamrl:{RUN}:workers:judge:judge-0")
                return bool(raw) and json.loads(raw).get("scored", 0) > 0

            wait_held("judge-0 scoring", scoring, trainer, lambda: len(up.steps()), lambda: up.proc.poll() is None)
            status = cli(up, "status", "--once")
            # The `judge` consumer group's consumers, pending and lag (a row of the streams table), and a
            # judge's heartbeat with its scoring rate (the workers table).
            assert re.search(r"│ judge\s+│\s+\d+ │\s+\d+ │\s+\d+ │", status), status
            assert re.search(r"│ judge\s+│ judge-[01]\s+│.*scored/s", status), status
            up.kill_role(RUN, "judge")
    code = up.wait()
    out = up.output()
    assert code == 0, out[-4000:]
    assert "judge-0 (judge) killed by SIGKILL; restarting in" in out, out[-4000:]
    s = up.summary()
    assert_exact(s)
    assert s["failed"] == 0 and s["dead_lettered"] == 0, s  # every judge output parsed; the kill lost nothing

    rows = up.metrics()
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for r in rows:  # the trained reward is the judge's digit / 9 (annotations.reward_weight: 0)
        parts = r["reward_components"]
        assert set(parts) == {"reward", "judge"}
        assert 0 <= parts["judge"] <= 9
        assert r["reward_mean"] == pytest.approx(parts["judge"] / 9, abs=1e-4)
    stopped = [e for e in log_events(up.run_dir, "judge-1") if e.get("event") == "stopped"]
    assert stopped and stopped[-1].get("scored", 0) > 0, "judge-1 (from `streamrl scale judge=2`) scored rollouts"
