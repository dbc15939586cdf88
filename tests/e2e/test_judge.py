"""The judge job end to end (`streamrl up` on configs/tiny-judge-cpu.yaml, real processes, a real
redis-server, real vLLM CPU engines): a judge worker is SIGKILLed mid-run and restarted, a second
joins with `streamrl scale judge=2`, `streamrl status` shows the judge group's lag, and the run ends
with the accounting exact and the judges' scores as the trained reward.

    pytest tests/e2e/test_judge.py
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.e2e.test_faults import ROOT, SMALL, Up, assert_exact

pytestmark = pytest.mark.slow
RUN, STEPS = "judge-e2e", 6


def cli(up: Up, *args: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "streamrl.cli", *args, "--run-dir", str(up.run_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout


@pytest.mark.timeout(900)
def test_judge_job_survives_a_sigkilled_judge_and_trains_on_its_scores(tmp_path):
    up = Up(tmp_path / "run", f"run.name={RUN}", f"trainer.steps={STEPS}", *SMALL, config="tiny-judge-cpu.yaml")
    up.wait_step(1)
    status = cli(up, "status", "--once")
    assert "judge" in status, status  # the judge consumer group and its lag, the judge worker's heartbeat
    up.kill_role(RUN, "judge")
    cli(up, "scale", "judge=2")
    code = up.wait()
    out = up.output()
    assert code == 0, out[-4000:]
    assert "judge-0 (judge) killed by SIGKILL; restarting in" in out, out[-4000:]
    assert_exact(up.summary())

    rows = [json.loads(ln) for ln in (up.run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for r in rows:  # the trained reward is the judge's digit / 9 (annotations.reward_weight: 0)
        parts = r["reward_components"]
        assert set(parts) == {"reward", "judge"}
        assert 0 <= parts["judge"] <= 9
        assert r["reward_mean"] == pytest.approx(parts["judge"] / 9, abs=1e-4)
    logs = [json.loads(ln) for ln in (up.run_dir / "logs" / "judge-1.jsonl").read_text().splitlines()]
    assert any(ln.get("event") == "started" for ln in logs), "judge-1 joined after `streamrl scale judge=2`"
