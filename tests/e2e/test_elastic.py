"""Elastic jobs end to end, in one `streamrl up` on the tiny config: workers added and removed by
`streamrl scale` (supervised) and by `streamrl worker` (joined from outside; one leaves cleanly while
the job runs), weights pulled by every generator from the trainer's memory (`weights.backend:
mooncake`), and external reward keys served by Node.js producers (scores reach the trainer; a killed
producer's key times out to its default). Once three jobs: a job's start-up is most of a short job's
time on 2 cores.

    pytest tests/e2e/test_elastic.py        # 1 run of `streamrl up`, a few minutes on 2 cores
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from bench import jobs
from bench.jobs import ROOT, Job, broker, cli_args, log_events, metrics
from streamrl.core.broker import Keys
from tests.e2e.hold import held, wait_held
from tests.nodejs import start_node_producer

STEPS = 20
"""Few steps suffice: the trainer is held from its start until the checks are done (a step
takes well under a second here; unheld, a 24-step job ended before status ran). While a started worker
has no work the held trainer takes a step every 5 s (wait_held): 20 steps leave over a minute for the
last of three generators' engines to come up after the first's."""
LOST_AT = STEPS - 6
"""The `lost` producer is SIGKILLed once step LOST_AT (or a later one, k) is trained, with the trainer held:
at most steps k+1..k+3 are admitted by then, the later ones after the kill, so their batches have only
`lost`'s default, while the first steps had its scores."""
BASE = ["loss.kl_beta=0", "rollout.max_staleness=1", "broker.claim_idle_ms=3000", "run.export=false"]

pytestmark = pytest.mark.slow


ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def cli(run_dir: Path, *args: str, log: str) -> subprocess.Popen:
    """`streamrl ARGS` in the background (a worker joining the job), its output in `log` beside the run."""
    path = run_dir.parent / log
    proc = subprocess.Popen(cli_args(*args), cwd=ROOT, env=ENV, stdout=open(path, "ab"), stderr=subprocess.STDOUT)
    proc.stdout_log = path
    return proc


def start_up(run_dir: Path, *sets: str) -> Job:
    return Job(run_dir, *BASE, f"trainer.steps={STEPS}", *sets, out=run_dir.parent / "up.log", env=ENV)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """`streamrl ARGS` to its end (60 s at most), its output captured."""
    return jobs.run_cli(*args, timeout=60, env=ENV)


def heartbeat(run_dir: Path, role: str, wid: str) -> dict:
    with broker(run_dir) as r:
        return jobs.heartbeat(r, "tiny", role, wid)


def generators_caught_up(run_dir: Path) -> bool:
    """Every generator that has loaded weights has loaded the newest announced version (none is mid-pull).
    Read from their logs' `weights_loaded` lines, written as each load ends (a heartbeat lags up to 5 s)."""
    with broker(run_dir) as r:
        version = int(r.hget(Keys("tiny").weights_latest, "version") or 0)
    for path in (run_dir / "logs").glob("gen*.jsonl"):
        loaded = [e["policy_version"] for e in log_events(run_dir, path.stem) if e.get("event") == "weights_loaded"]
        if loaded and loaded[-1] < version:
            return False
    return True


def finish(up: Job, run_dir: Path, timeout: float = 600) -> list[dict]:
    code = up.wait(timeout=timeout)
    assert code == 0, up.output()[-4000:]
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(r["samples"] == 64 for r in rows)
    return rows


def stop(proc: subprocess.Popen, sig=signal.SIGTERM, timeout: float = 120) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        log = getattr(proc, "stdout_log", None)
        tail = log.read_text(errors="replace")[-6000:] if log else "(no log)"
        raise AssertionError(
            f"{proc.args[3:5]} still running {timeout} s after {sig!r}; its log ends:\n{tail}"
        ) from None


def end(procs: list[subprocess.Popen]) -> None:
    """Stop workers whose broker is gone (the run ended): SIGTERM, then a second one forces the exit (and
    takes vLLM's engine process with it). All at once, the second soon: a graceful stop on a missing broker
    waits out its reconnects (9 s each, one after another, in a run on 2026-12-06), and nothing is checked
    of it here."""
    for sig, wait_s in ((signal.SIGTERM, 1), (signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        live = [p for p in procs if p.poll() is None]
        for proc in live:
            proc.send_signal(sig)
        deadline = time.time() + wait_s
        while time.time() < deadline and any(p.poll() is None for p in live):
            time.sleep(0.1)
    for proc in procs:
        proc.wait(timeout=10)


def assert_nothing_lost(run_dir: Path) -> None:
    """The supervisor's accounting (RUN_DIR/summary.json): every admitted group trained or accounted for."""
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["invariant_holds"] and summary["lost"] == 0 and summary["double_trained"] == 0, summary
    assert summary["failed"] == 0 and summary["dead_lettered"] == 0, summary


# Two external keys, each scored by its own Node.js producer (completion tokens / 16): `judge` is served
# to the end; `lost`'s producer is SIGKILLed after step LOST_AT, so its key times out (3 s) to its default.
# One job shows both: scores reach the trainer, and a dead producer's key falls back without
# holding up the other key or failing a group. (The scale job's: a job of their own cost a start-up.)
JUDGES = (
    "annotations.external=[{key: judge, weight: 0.5, timeout_s: 60, on_timeout: default, default: -1.0}, "
    "{key: lost, weight: 0.5, timeout_s: 3, on_timeout: default, default: -1.0}]"
)


def attach_node_producer(up: Job, run_dir: Path, key: str) -> subprocess.Popen:
    """`streamrl producer add KEY` (a restricted broker user), then the Node.js producer of KEY under it."""
    up.wait_broker()
    res = run_cli("producer", "add", key, "--run", "tiny", "--run-dir", str(run_dir))
    assert res.returncode == 0, res.stderr
    return start_node_producer(
        res.stdout.splitlines()[0],
        "tiny",
        key,
        run_dir.parent / f"node-{key}.log",
        "--max-tokens",
        "16",
        "--claim-idle-ms",
        "3000",
    )


def join(run_dir: Path, joined: dict, role: str, wid: str, *sets: str) -> None:
    """`streamrl worker ROLE` from outside the job (the run's config.yaml), as on another host."""
    args = ["worker", role, "--config", str(run_dir / "config.yaml"), "--run-dir", str(run_dir), "--id", wid]
    joined[wid] = cli(run_dir, *args, *[a for s in sets for a in ("--set", s)], log=f"{wid}.log")


def scale(run_dir: Path, *counts: str) -> None:
    res = run_cli("scale", *counts, "--run-dir", str(run_dir))
    assert res.returncode == 0, res.stderr


@pytest.mark.timeout(900)
def test_workers_scale_join_and_leave_while_node_producers_score(tmp_path):
    run_dir = tmp_path / "run"
    # No generator to begin with: the run advances only through the ones `streamrl scale` starts and
    # the one that joins. A short drain for the supervised ones: a generator stopped by the scale-down
    # finishes (or hands back) its in-flight groups within generator.drain_timeout_s, which ends while
    # the trainer is held below. Weights through the transfer engine: generators that come and go pull
    # from the trainer's memory, no rendezvous.
    up = start_up(run_dir, "generator.count=0", "generator.drain_timeout_s=3", "weights.backend=mooncake", JUDGES)
    up.wait_for(
        "config.yaml",
        lambda: (run_dir / "config.yaml").exists() and (run_dir / "broker" / "url").exists(),
        timeout=120,
    )
    judge = attach_node_producer(up, run_dir, "judge")
    lost = attach_node_producer(up, run_dir, "lost")
    joined: dict[str, subprocess.Popen] = {}
    try:
        rows, killed_at = _scale_join_and_leave(up, run_dir, lost, joined)
        code = judge.wait(timeout=10)  # it saw the run end (run:end) and left before up stopped the broker
    finally:
        for node in (judge, lost):
            if node.poll() is None:
                stop(node)
        end(list(joined.values()))  # rew-a lost its broker when the run ended
    assert_external_keys(rows, killed_at, code, run_dir.parent / "node-judge.log")
    out = up.output()
    for line in (
        "scale: started generator-0",
        "scale: started generator-1",
        "scale: started reward-1",
        "scale: stopping generator-1",
        "scale: stopping reward-1",
    ):
        assert line in out, out
    assert "scale: stopping generator-0" not in out and all(r["failed"] == 0 for r in rows)
    # The joined generator left cleanly: it drained its in-flight groups first (none aborted).
    stopped = next(e for e in log_events(run_dir, "gen-a") if e["event"] == "stopped")
    assert stopped["rollouts"] > 0 and stopped.get("groups_aborted", 0) == 0
    for wid in ("gen-a", "generator-0"):  # each pulled versions through its own engine (TCP: no RDMA NIC here)
        events = log_events(run_dir, wid)
        assert any(e["event"] == "weights_engine_started" and e["protocol"] == "tcp" for e in events), wid
        assert any(e["event"] == "weights_loaded" and e["policy_version"] >= 1 for e in events), wid
    assert_nothing_lost(run_dir)


def _scale_join_and_leave(up: Job, run_dir: Path, lost: subprocess.Popen, joined: dict) -> tuple[list[dict], int]:
    """`scale generator=2 reward=2` and a generator and a reward worker joined with `streamrl worker`,
    all working and shown by status; `scale generator=1 reward=1` and the joined generator stopped
    (SIGTERM), all with the trainer held; the `lost` producer SIGKILLed after step LOST_AT. The job's
    rows once it ended, and the step `lost` was killed after."""
    scale(run_dir, "generator=2", "reward=2")  # while the trainer starts: all start-ups at once
    join(run_dir, joined, "generator", "gen-a", "generator.drain_timeout_s=30")  # the default drain
    join(run_dir, joined, "reward", "rew-a")
    trainer = up.wait_for(
        "the trainer's heartbeat", lambda: heartbeat(run_dir, "trainer", "trainer-0").get("pid"), timeout=120
    )
    # The trainer held (SIGSTOP) from its start (before the generators' engines are up) until status,
    # the scale-down and gen-a's leaving are looked at: a step takes well under a second here, so without
    # the hold the job could end while status is still starting. wait_held lets it step when a worker is
    # left without work in the admission window.
    with held(trainer):
        wait_held(
            "three generators producing (gen-a on a version it pulled) and three reward workers scoring",
            lambda: all(
                heartbeat(run_dir, role, wid).get(counter, 0) >= least
                for role, wid, counter, least in (
                    ("generator", "generator-0", "rollouts", 1),
                    ("generator", "generator-1", "rollouts", 1),
                    ("generator", "gen-a", "rollouts", 1),
                    ("generator", "gen-a", "policy_version", 1),
                    ("reward", "reward-0", "scored", 1),
                    ("reward", "reward-1", "scored", 1),
                    ("reward", "rew-a", "scored", 1),
                )
            ),
            trainer,
            steps=lambda: len(metrics(run_dir)),
            job_alive=up.alive,
            idle_s=5,
            settled=lambda: generators_caught_up(run_dir),
        )
        status = run_cli("status", "--run-dir", str(run_dir), "--once")
        assert status.returncode == 0, status.stderr
        for text in ("trainer version", "rollouts", "generator-0", "generator-1", "reward-1", "lag", "rollouts/s"):
            assert text in status.stdout, status.stdout
        assert len(metrics(run_dir)) < STEPS
        scale(run_dir, "generator=1", "reward=1")
        assert stop(joined["gen-a"]) == 0  # leaves cleanly: drains its in-flight groups first
        assert not heartbeat(run_dir, "generator", "gen-a")  # and deregisters
        up.wait_for(
            "generator-1 and reward-1 to leave",
            lambda: all(f"{w} left (exited with code 0)" in up.output() for w in ("generator-1", "reward-1")),
        )
    up.wait_step(LOST_AT)
    with held(trainer):
        killed_at = len(metrics(run_dir))
        assert killed_at + 4 <= STEPS, f"step {killed_at} trained before `lost` was killed: no batch after"
        assert stop(lost, signal.SIGKILL) == -signal.SIGKILL
    return finish(up, run_dir), killed_at


def assert_external_keys(rows: list[dict], killed_at: int, code: int, log_path: Path) -> None:
    """Both keys' scores reached the trainer with their weights; `lost`'s default once its producer was
    killed (the batches admitted after step `killed_at` + 3), without failing a group; the live producer
    saw the run end and left cleanly."""
    for r in rows:
        parts = r["reward_components"]
        assert set(parts) == {"reward", "judge", "lost"}
        # The toy judge scores completion tokens / 16: its mean is the batch's mean length / 16.
        assert parts["judge"] == pytest.approx(r["completion_len_mean"] / 16, abs=1e-5)
        assert r["reward_mean"] == pytest.approx(parts["reward"] + 0.5 * parts["judge"] + 0.5 * parts["lost"], abs=1e-5)
        assert r["failed"] == 0
    assert rows[0]["reward_components"]["lost"] == pytest.approx(rows[0]["completion_len_mean"] / 16, abs=1e-5)
    assert rows[0]["annotation_timeouts"] == 0
    after = rows[killed_at + 3 :]
    assert after, killed_at
    for r in after:
        assert r["reward_components"]["lost"] == -1.0  # every rollout of the batch got the default
        assert r["annotation_timeouts"] >= 64  # of `lost` only: `judge` was served in time (its score above)
    log = log_path.read_text()
    assert code == 0 and '"event":"stopped"' in log and '"reason":"run tiny ended: trainer finished"' in log, log[
        -2000:
    ]
    assert '"event":"broker_error"' not in log, log[-2000:]
