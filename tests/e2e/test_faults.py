"""Fault injection on the whole job: `streamrl up` subprocesses on the tiny config, real processes,
a real redis-server. Each role is SIGKILLed mid-run, the broker is killed and restarted, and the
trainer is killed, resumed with `streamrl up --resume` and stopped with a terminal's Ctrl-C (SIGINT
to its whole process group); every run must end with the accounting invariant exact
(RUN_DIR/summary.json), zero lost groups and zero double-trained rollouts.

    pytest tests/e2e/test_faults.py
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from bench.jobs import QUICK_RECOVERY, Job, assert_exact
from streamrl.train.checkpoint import latest_checkpoint

pytestmark = pytest.mark.slow


def assert_metrics(up: Job, steps: int, max_staleness: int = 1, checkpoint_every: int = 3) -> None:
    rows = up.metrics()
    assert [r["step"] for r in rows] == list(range(1, steps + 1)), "every step exactly once"
    assert all(r["staleness_max"] <= max_staleness for r in rows), [r["staleness_max"] for r in rows]
    saved = [r["step"] for r in rows if "checkpoint_stall_s" in r]
    assert saved == [s for s in range(1, steps + 1) if s % checkpoint_every == 0 or s == steps], saved
    assert all(r["checkpoint_stall_s"] >= 0 for r in rows if "checkpoint_stall_s" in r)


def assert_replays_from(replay: list[int], version: int, logged: list[int]) -> None:
    """The resumed trainer replays the steps after checkpoint `version`, one after another, at least
    those the killed run logged (a batch recorded but not yet logged is replayed too)."""
    assert replay == list(range(version + 1, version + 1 + len(replay))), (replay, version)
    assert not logged or logged[-1] <= version or replay[-1] >= logged[-1], (replay, logged)


def resume_to_the_end(run_dir: Path, steps: int, *sets: str) -> None:
    """`up --resume` to the last step: every step logged once, nothing in flight, every group trained once."""
    up = Job(run_dir, *sets, resume=True)
    assert up.wait() == 0, up.output()[-4000:]
    assert_metrics(up, steps)
    s = up.summary()
    assert_exact(s, in_flight_ok=False)
    assert s["trained"] == steps * 8 and s["trained_rollouts"] == steps * 64 and s["double_trained"] == 0


@pytest.mark.timeout(1500)
def test_every_worker_role_sigkilled_broker_restarted_then_two_rank_trainer_resumed_and_stopped(tmp_path):
    """generator, reward, reference and feeder each SIGKILLed, then redis-server, under a trainer of
    FSDP2 over two gloo ranks; then the trainer itself: the sharded checkpoint (DCP) is written by both
    ranks and read back by both. `up --resume` replays the logged steps above the checkpoint; a terminal's
    Ctrl-C (SIGINT to the whole process group) then stops it gracefully and quickly (both ranks
    checkpoint, exit 130, the broker gone); a second resume finishes exactly. No group is trained twice
    or skipped, staleness stays bounded. (One job, not two: each `up` costs its start-up, about a third
    of such a test on 2 cores; the Ctrl-C was test_ctrl_c's job of its own. The single-rank trainer's
    death message is tests/integration/launch/test_child_leftovers.py's.)"""
    # 20 steps: once the broker is back a step takes well under a second here, and the trainer must still
    # be training when it is killed after checkpoint 6 is marked (at 10 CI saw the job end first), and
    # the resumed run when it gets its SIGINT two steps past what the killed run logged.
    run, steps = "faults-a", 20
    up = Job(
        tmp_path / "a",
        f"run.name={run}",
        f"trainer.steps={steps}",
        "trainer.checkpoint_every=3",
        "trainer.world_size=2",
        *QUICK_RECOVERY,
    )
    up.wait_step(2)
    up.kill_role(run, "generator")
    up.wait_step(4)
    for role in ("reward", "reference", "feeder"):
        up.kill_role(run, role)
    up.wait_step(6)
    before = up.steps()[-1]
    up.kill_broker()
    up.wait_output("broker back after")
    up.wait_step(before + 1)  # trained again after the broker came back
    up.wait_checkpointed(run, 6)
    up.kill_role(run, "trainer")
    out = (up.wait(), up.output())[1]
    for role in ("generator", "reward", "reference", "feeder"):
        assert f"{role}-0 ({role}) killed by SIGKILL; restarting in" in out  # kill -9 is not "out of memory"
    assert out.count("restarting in") >= 4
    assert "broker (redis-server) killed by SIGKILL" in out and "broker back after" in out
    # The heartbeat's pid is rank 0's: the trainer process names the rank and exits, the run ends.
    assert up.proc.returncode == 1 and "trainer rank 0 failed: killed by SIGKILL" in out, out[-4000:]
    s = up.summary()
    assert_exact(s)
    # The trainer ran on while checkpoint 6 was written: a later one may be the last complete.
    version, logged = s["checkpointed_version"], up.steps()
    assert version >= 6 and version % 3 == 0 and logged[-1] < steps, (version, logged)
    assert s["in_flight"] > 0  # the steps above the checkpoint wait for their replay

    # A trim pass every 0.2 s: the resumed run's last steps can take about a second in all here, less
    # than QUICK_RECOVERY's 2 s between passes, and the assertion below is about the resumed trainer's trimming.
    trim = "trainer.trim_every_s=0.2"
    # Its own session: `up` leads a process group, as a shell's foreground job does.
    up2 = Job(up.run_dir, trim, resume=True, new_session=True)
    up2.wait_step(logged[-1] + 2)  # past what the killed run logged: steps of the resumed run
    with up2.redis() as r:
        broker_pid = int(r.info("server")["process_id"])
    t0 = time.time()
    os.killpg(up2.proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: every process of the group gets it
    code = up2.wait()
    assert_stopped_cleanly(up2, code, time.time() - t0, broker_pid, steps)
    s = up2.summary()
    assert_exact(s)
    stopped_at = up2.steps()[-1]
    # graceful: both ranks checkpointed what they trained
    assert stopped_at < steps and s["checkpointed_version"] == stopped_at, (s, stopped_at)

    resume_to_the_end(up.run_dir, steps, trim)
    log = [json.loads(ln) for ln in (up.run_dir / "logs" / "trainer-0.jsonl").read_text().splitlines()]
    resumed = [r for r in log if r["event"] == "resumed"]
    assert len(resumed) == 2 and resumed[0]["policy_version"] == version, resumed
    assert_replays_from(resumed[0]["replay_steps"], version, logged)
    assert resumed[1]["policy_version"] == stopped_at, resumed
    assert [r["world_size"] for r in log if r["event"] == "trainer_ready"] == [2, 2, 2]
    trimmed = [r.get("trimmed", 0) for r in log if r["event"] == "stopped"]
    assert trimmed and trimmed[-1] > 0, "the trainer trims consumed stream entries"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def assert_stopped_cleanly(up: Job, code: int, took: float, broker_pid: int, steps: int) -> None:
    """Ctrl-C (SIGINT to `up`'s whole process group, every role included) stops the job cleanly and
    quickly: exit 130, the final checkpoint and the accounting written, the console's last step the one
    checkpointed, the resume command last, the broker stopped last and not left behind."""
    text, run_dir = up.output(), up.run_dir
    print(f"stopped {took:.1f}s after the group's SIGINT (exit {code})")
    assert code == 130, f"exit {code} after {took:.1f}s:\n{text[-4000:]}"
    assert took < 20, f"stopping took {took:.1f}s:\n{text[-4000:]}"
    assert "did not stop within" not in text and "accounting skipped" not in text, text[-4000:]
    assert text.rstrip().endswith(f"continue this run with `streamrl up --resume {run_dir}`"), text[-2000:]
    assert " | loss " in text and " gnorm " in text, text[-4000:]  # the optimisation on the step line
    samples = [json.loads(ln) for ln in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert {r["step"] for r in samples} >= {1, 2} and all(r["prompt"] for r in samples)
    # A completion is text; empty only where the model's first token was its EOS (one in ~400 here).
    assert all(r["completion"] or (r["finish_reason"] == "stop" and r["tokens"] == 1) for r in samples)
    assert sum(bool(r["completion"]) for r in samples) > 0.9 * len(samples)
    for log in (run_dir / "logs").glob("*.out"):  # the exit noise of triton's bindings is gone
        assert "nanobind: leaked" not in log.read_text(errors="replace"), log
    last = up.steps()[-1]
    assert latest_checkpoint(run_dir).name == f"step-{last:08d}"
    # the console ends where metrics.jsonl and the checkpoint do (the step finished while stopping)
    shown = [ln for ln in text.splitlines() if ln.startswith("step ") and f"/{steps} | reward" in ln]
    assert shown[-1].startswith(f"step {last:>4}/{steps} "), (shown[-3:], last)
    stopped = time.time() + 10
    while _alive(broker_pid) and time.time() < stopped:
        time.sleep(0.1)
    assert not _alive(broker_pid), "the embedded redis-server outlived `streamrl up`"
