"""Multi-turn episodes end to end: `streamrl up --config configs/tiny-multiturn-cpu.yaml` (real broker,
vLLM, env worker, reward, FSDP trainer) learns the two-turn task, and survives its env worker and
its generator being SIGKILLed mid-run (in the same job) with the accounting invariant exact.

    pytest tests/e2e/test_multiturn.py
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from bench.jobs import Job, heartbeat, log_events, metrics, summary
from tests.e2e.hold import held

RUN = "tiny-multiturn"
pytestmark = pytest.mark.slow


def start(run_dir: Path, *sets: str) -> Job:
    # no RUN_DIR/hf: what these tests check is elsewhere (test_up checks the export)
    return Job(run_dir, "run.export=false", *sets, config="tiny-multiturn-cpu.yaml")


def wait_episodes_in_flight(job: Job, timeout: float = 120) -> None:
    """Until some episode is between turns (its checkpoint exists): a kill then interrupts episodes,
    not only groups waiting for newer weights (which have not started and are simply run later)."""
    with job.redis() as r:
        job.wait_for("an episode in flight", lambda: r.keys(f"streamrl:{RUN}:episode_state:*"), timeout, every=0.01)


LEARN_STEPS = 50
RISE = 0.2


@pytest.mark.timeout(900)  # ~3 min on CI; 9.6 min on a 2-core machine at load 15
def test_multiturn_job_learns_and_survives_env_and_generator_sigkill(tmp_path):
    """One job for both (a second 16-step job only for the kills cost as much as a third of this one):
    the env worker is SIGKILLed at step 3 (its in-flight steps are claimed by the restarted env-0 and
    replayed), the generator once episodes are between turns after step 7 (the restarted generator-0
    continues them from their last turn); the job still trains every step exactly once and learns."""
    run_dir = tmp_path / "mt"
    # 50 steps, the config's own run (docs/performance.md: +0.45 from the first to the last 10 steps):
    # at 40 one clean-clone run rose only +0.29 (still rising), under the bound below.
    job = start(
        run_dir,
        f"trainer.steps={LEARN_STEPS}",
        "broker.claim_idle_ms=2000",
        "generator.drain_timeout_s=2",
        "supervisor.backoff_s=0.5",
        "supervisor.grace_s=30",
        "trainer.trim_every_s=2",
    )
    try:
        job.wait_step(3, timeout=300)
        job.kill_role(RUN, "env")
        job.wait_step(7, timeout=300)
        # The env worker held: an episode between turns (state written, step request out) stays between
        # turns until the generator is killed, so the kill always interrupts checkpointed episodes (without
        # the hold a loaded machine's episode could finish its turn between the check and the kill: one
        # clean-clone run restarted all 14 groups and continued none).
        with job.redis() as r:
            env_pid = heartbeat(r, RUN, "env", "env-0")["pid"]
        with held(env_pid):
            wait_episodes_in_flight(job)
            job.kill_role(RUN, "generator")
        assert job.wait(500) == 0, job.output()[-4000:]
    finally:
        job.stop(signal.SIGKILL)
    text = job.output()
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
    s = summary(run_dir)
    assert s["invariant_holds"] and s["lost"] == 0 and s["double_trained"] == 0, s
    assert s["trained_steps"] == LEARN_STEPS
    e = s["episodes"]
    assert e["invariant_holds"] and e["lost"] == 0 and e["episodes_failed"] == 0, e
    assert e["trained"] == LEARN_STEPS * 64, e
    assert e["groups_restarted"] >= 1 and e["episodes_continued"] >= 1, e
    assert "turns 2.00" in text and "episodes: admitted" in text
    assert "model: not exported (run.export=false)" in text and not (run_dir / "hf").exists()


SHORT_STEPS = 2
"""The two short jobs below: the fewest steps that show every episode of a job answered by Node, or an
env error failing its episodes while the job trains on (a step's 64 episodes already show each)."""


@pytest.mark.timeout(600)
def test_node_env_drives_a_job(tmp_path):
    from tests.nodejs import start_node_env

    run_dir = tmp_path / "node"
    job = start(run_dir, f"trainer.steps={SHORT_STEPS}", "env.fn=external")  # no Python env worker: only Node
    node = None
    try:
        job.wait_broker()
        node = start_node_env((run_dir / "broker" / "url").read_text().strip(), RUN, tmp_path / "node-env.log")
        assert job.wait(500) == 0, job.output()[-4000:]
    finally:
        if node is not None:
            node.send_signal(signal.SIGTERM)
            node.wait(30)
        job.stop(signal.SIGKILL)
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, SHORT_STEPS + 1))
    assert all(r["turns_mean"] == 2 and r["env_tokens"] > 0 for r in rows)
    s = summary(run_dir)
    assert s["invariant_holds"] and s["episodes"]["trained"] == SHORT_STEPS * 64
    node_log = [json.loads(ln) for ln in (tmp_path / "node-env.log").read_text().splitlines() if ln.startswith("{")]
    stopped = [e for e in node_log if e["event"] == "stopped"]
    assert stopped and stopped[0]["steps"] >= SHORT_STEPS * 64 * 2  # every episode: two steps, all answered by Node
    assert not [e for e in node_log if e["event"] in ("dead_letter", "step_failed")]


@pytest.mark.timeout(600)
def test_env_errors_fail_their_episodes_not_the_job(tmp_path):
    run_dir = tmp_path / "flaky"
    job = start(run_dir, f"trainer.steps={SHORT_STEPS}", "env.fn=tests.programs.env_fns:FlakyDialog")
    assert job.wait(500) == 0, job.output()[-4000:]
    s = summary(run_dir)
    assert s["invariant_holds"] and s["lost"] == 0, s
    assert s["failed"] >= 1 and s["episodes"]["episodes_failed"] >= s["failed"], s["episodes"]
    assert s["dead_lettered"] >= 2 * s["failed"]  # the step request (env worker) and the prompt (generator)
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, SHORT_STEPS + 1)) and rows[-1]["episodes_failed"] >= 1
    assert "failed episodes" in job.output()
    failed = [e for e in log_events(run_dir, "generator-0") if e.get("event") == "episode_failed"]
    assert failed and all("flaky tool crashed" in e["reason"] for e in failed)
