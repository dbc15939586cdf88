"""Ctrl-C in a terminal: SIGINT reaches the whole foreground process group of `streamrl up`, not
just its pid. The job must still stop cleanly (final checkpoint, accounting written) and quickly,
with the broker stopped last and not left behind. It runs at rollout.max_staleness=0, and its steps
are checked to be on-policy (staleness 0, nothing dropped stale).

    pytest tests/e2e/test_ctrl_c.py
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from bench.jobs import Job, assert_exact, metrics, steps
from streamrl.train.checkpoint import latest_checkpoint

pytestmark = pytest.mark.slow


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.timeout(600)
def test_sigint_to_the_process_group_stops_cleanly(tmp_path):
    run_dir = tmp_path / "ctrlc"
    # On-policy (the batch waits for the weights it was generated with): what test_up's own 6-step
    # job used to show, checked on this job's steps instead of a job of its own. Its own session: `up`
    # leads a process group, as a shell's foreground job does.
    job = Job(run_dir, "trainer.steps=60", "rollout.max_staleness=0", out=tmp_path / "up.out", new_session=True)
    proc, out_path = job.proc, job.out_path
    try:
        job.wait_step(2)
        with job.redis() as r:
            broker_pid = int(r.info("server")["process_id"])
        t0 = time.time()
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        try:
            code = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            code = None
        took = time.time() - t0
        text = out_path.read_text(errors="replace")
        print(f"stopped {took:.1f}s after the group's SIGINT (exit {code})")
        assert code == 130, f"exit {code} after {took:.1f}s:\n{text[-4000:]}"
        assert took < 20, f"stopping took {took:.1f}s:\n{text[-4000:]}"
        assert "did not stop within" not in text and "accounting skipped" not in text, text[-4000:]
        assert text.rstrip().endswith(f"continue this run with `streamrl up --resume {run_dir}`"), text[-2000:]
        assert " | loss " in text and " gnorm " in text, text[-4000:]  # the optimisation on the step line
        samples = [json.loads(ln) for ln in (run_dir / "samples.jsonl").read_text().splitlines()]
        assert {r["step"] for r in samples} >= {1, 2} and all(r["prompt"] and r["completion"] for r in samples)
        for log in (run_dir / "logs").glob("*.out"):  # the exit noise of triton's bindings is gone
            assert "nanobind: leaked" not in log.read_text(errors="replace"), log
        rows = metrics(run_dir)
        assert all(r["staleness_max"] == 0 and set(r["staleness_hist"]) == {"0"} for r in rows), rows
        assert all(r["dropped_stale"] == 0 for r in rows)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert_exact(summary)
        last = steps(run_dir)[-1]
        assert summary["checkpointed_version"] == last, (summary, last)  # the final checkpoint was written
        assert latest_checkpoint(run_dir).name == f"step-{last:08d}"
        # the console ends where metrics.jsonl and the checkpoint do (the step finished while stopping)
        shown = [ln for ln in text.splitlines() if ln.startswith("step ") and "/60 | reward" in ln]
        assert shown[-1].startswith(f"step {last:>4}/60 "), (shown[-3:], last)
        stopped = time.time() + 10
        while _alive(broker_pid) and time.time() < stopped:
            time.sleep(0.1)
        assert not _alive(broker_pid), "the embedded redis-server outlived `streamrl up`"
    finally:
        job.stop()  # only `up` (SIGINT): it stops its roles and its broker
