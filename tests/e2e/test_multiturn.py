"""Multi-turn episodes end to end: `streamrl up --config configs/tiny-multiturn-cpu.yaml` (real broker,
vLLM, env worker, reward, FSDP trainer) learns the two-turn task, and survives its env worker and
its generator being SIGKILLed mid-run (in the same job) with the accounting invariant exact.

    pytest tests/e2e/test_multiturn.py
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "tiny-multiturn-cpu.yaml"
RUN = "tiny-multiturn"
pytestmark = pytest.mark.slow


def start(run_dir: Path, *sets: str) -> tuple[subprocess.Popen, Path]:
    cmd = [sys.executable, "-m", "streamrl.cli", "up", "--config", str(CONFIG), "--run-dir", str(run_dir)]
    cmd += [
        "--set",
        "run.export=false",
    ]  # no RUN_DIR/hf: what these tests check is elsewhere (test_up checks the export)
    for s in sets:
        cmd += ["--set", s]
    out = run_dir.parent / f"{run_dir.name}.out"
    return subprocess.Popen(cmd, cwd=ROOT, stdout=open(out, "wb"), stderr=subprocess.STDOUT), out


def metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def wait_step(proc: subprocess.Popen, out: Path, run_dir: Path, n: int, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not (rows := metrics(run_dir)) or rows[-1]["step"] < n:
        assert proc.poll() is None, f"up exited early:\n{out.read_text()[-4000:]}"
        assert time.time() < deadline, f"step {n} not reached:\n{out.read_text()[-4000:]}"
        time.sleep(0.3)


def wait_episodes_in_flight(run_dir: Path, timeout: float = 120) -> None:
    """Until some episode is between turns (its checkpoint exists): a kill then interrupts episodes,
    not only groups waiting for newer weights (which have not started and are simply run later)."""
    deadline = time.time() + timeout
    with redis.Redis.from_url((run_dir / "broker" / "url").read_text().strip()) as r:
        while not r.keys(f"streamrl:{RUN}:episode_state:*"):
            assert time.time() < deadline, "no episode in flight"
            time.sleep(0.01)


LEARN_STEPS = 50
RISE = 0.2


def kill_role(run_dir: Path, role: str) -> int:
    """SIGKILL `<role>-0` (this test's own child of `up`), its pid from its heartbeat."""
    with redis.Redis.from_url((run_dir / "broker" / "url").read_text().strip()) as r:
        pid = json.loads(r.get(f"streamrl:{RUN}:workers:{role}:{role}-0"))["pid"]
    os.kill(pid, signal.SIGKILL)
    return pid


@pytest.mark.timeout(900)  # ~3 min on CI; 9.6 min on a 2-core machine at load 15
def test_multiturn_job_learns_and_survives_env_and_generator_sigkill(tmp_path):
    """One job for both (a second 16-step job only for the kills cost as much as a third of this one):
    the env worker is SIGKILLed at step 3 (its in-flight steps are claimed by the restarted env-0 and
    replayed), the generator once episodes are between turns after step 7 (the restarted generator-0
    continues them from their last turn); the job still trains every step exactly once and learns."""
    run_dir = tmp_path / "mt"
    # 50 steps, the config's own run (docs/performance.md: +0.45 from the first to the last 10 steps):
    # at 40 one clean-clone run rose only +0.29 (still rising), under the bound below.
    proc, out = start(
        run_dir,
        f"trainer.steps={LEARN_STEPS}",
        "broker.claim_idle_ms=2000",
        "generator.drain_timeout_s=2",
        "supervisor.backoff_s=0.5",
        "supervisor.grace_s=30",
        "trainer.trim_every_s=2",
    )
    try:
        wait_step(proc, out, run_dir, 3)
        kill_role(run_dir, "env")
        wait_step(proc, out, run_dir, 7)
        wait_episodes_in_flight(run_dir)
        kill_role(run_dir, "generator")
        assert proc.wait(500) == 0, out.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    text = out.read_text()
    assert "env-0 (env) killed by SIGKILL" in text and "generator-0 (generator) killed by SIGKILL" in text
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, LEARN_STEPS + 1))
    for r in rows:
        assert r["turns_mean"] > 1, "every episode should take the env's answer and a second turn"
        assert r["staleness_max"] <= 1
        assert r["env_tokens"] > 0 and 0.02 <= r["env_step_s_p50"] <= r["env_step_s_p99"]
        assert r["episodes_failed"] == 0
    first = sum(r["reward_mean"] for r in rows[:10]) / 10
    last = sum(r["reward_mean"] for r in rows[-10:]) / 10
    # The bound comes from the spread of this run's rise on 2 CPU cores (async, so not deterministic):
    # +0.30, +0.45, +0.53, +0.53 over four runs (mean 0.45, sd 0.11); +0.30 sat on the old 0.3 bound and
    # failed. 0.2 is two sd below the mean and still more than doubles the untrained reward (~0.19).
    assert last - first >= RISE, f"reward did not rise enough: first10={first:.3f} last10={last:.3f}"
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["invariant_holds"] and s["lost"] == 0 and s["double_trained"] == 0, s
    assert s["trained_steps"] == LEARN_STEPS
    e = s["episodes"]
    assert e["invariant_holds"] and e["lost"] == 0 and e["episodes_failed"] == 0, e
    assert e["trained"] == LEARN_STEPS * 64, e
    assert e["groups_restarted"] >= 1 and e["episodes_continued"] >= 1, e
    assert "turns 2.00" in text and "episodes: admitted" in text
    assert "model: not exported (run.export=false)" in text and not (run_dir / "hf").exists()


@pytest.mark.timeout(600)
def test_node_env_drives_a_job(tmp_path):
    from tests.nodejs import start_node_env

    run_dir = tmp_path / "node"
    proc, out = start(run_dir, "trainer.steps=4", "env.fn=external")  # no Python env worker: only the Node one
    node = None
    try:
        url_file = run_dir / "broker" / "url"
        deadline = time.time() + 120
        while not url_file.exists():
            assert proc.poll() is None and time.time() < deadline, out.read_text()[-4000:]
            time.sleep(0.2)
        node = start_node_env(url_file.read_text().strip(), RUN, tmp_path / "node-env.log")
        assert proc.wait(500) == 0, out.read_text()[-4000:]
    finally:
        if node is not None:
            node.send_signal(signal.SIGTERM)
            node.wait(30)
        if proc.poll() is None:
            proc.kill()
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["turns_mean"] == 2 and r["env_tokens"] > 0 for r in rows)
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["invariant_holds"] and s["episodes"]["trained"] == 4 * 64
    node_log = [json.loads(ln) for ln in (tmp_path / "node-env.log").read_text().splitlines() if ln.startswith("{")]
    stopped = [e for e in node_log if e["event"] == "stopped"]
    assert stopped and stopped[0]["steps"] >= 4 * 64 * 2  # every episode: two steps, all answered by Node
    assert not [e for e in node_log if e["event"] in ("dead_letter", "step_failed")]


@pytest.mark.timeout(600)
def test_env_errors_fail_their_episodes_not_the_job(tmp_path):
    run_dir = tmp_path / "flaky"
    proc, out = start(run_dir, "trainer.steps=4", "env.fn=tests.programs.env_fns:FlakyDialog")
    assert proc.wait(500) == 0, out.read_text()[-4000:]
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["invariant_holds"] and s["lost"] == 0, s
    assert s["failed"] >= 1 and s["episodes"]["episodes_failed"] >= s["failed"], s["episodes"]
    assert s["dead_lettered"] >= 2 * s["failed"]  # the step request (env worker) and the prompt (generator)
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[-1]["episodes_failed"] >= 1
    assert "failed episodes" in out.read_text()
    events = [json.loads(ln) for ln in (run_dir / "logs" / "generator-0.jsonl").read_text().splitlines()]
    failed = [e for e in events if e.get("event") == "episode_failed"]
    assert failed and all("flaky tool crashed" in e["reason"] for e in failed)
