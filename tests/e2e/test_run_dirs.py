"""Run directories: two concurrent default jobs (same run.name) keep their own host-local weights;
a used run dir is not silently resumed; `scale` and `status` on a finished run say so. Job b also
scores with a flaky reward function under reward.on_error=score, which trains its groups.

One module fixture runs the two jobs once (3 steps each, concurrently); the other tests reuse the
finished run directories, so they start no vLLM of their own.

    pytest tests/e2e/test_run_dirs.py
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import redis

from bench.jobs import Job, assert_exact, metrics, run_cli, steps, summary, up
from streamrl.core.broker import Keys

STEPS = 3
pytestmark = pytest.mark.slow


def _weights_handle(run_dir: Path) -> str | None:
    """The published weights path `weights:latest` names in this job's broker (None: not yet)."""
    url_file = run_dir / "broker" / "url"
    if not url_file.is_file():
        return None
    try:
        with redis.Redis.from_url(url_file.read_text().strip(), socket_timeout=2) as r:
            raw = r.hget(Keys("tiny").weights_latest, "handle")
    except (redis.RedisError, ValueError):
        return None
    return raw.decode() if raw else None


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two `streamrl up` of the default config (run.name tiny) at once, in two run directories."""
    base = tmp_path_factory.mktemp("two")
    # What is checked is the run dirs and weights of two jobs of one name: no reference worker (about
    # 6 s of CPU each) and no RUN_DIR/hf export (4 s) in either. Job b's reward function raises on
    # about one completion in five, scored reward.on_error's way instead of failing its group (a job of
    # its own in test_reward_failures cost a job's start-up for it).
    sets = (f"trainer.steps={STEPS}", "loss.kl_beta=0", "run.export=false")
    flaky = ("reward.fn=tests.programs.reward_fns:fail_one_in_five", "reward.on_error=score")
    jobs = {
        name: Job(base / name, *sets, *extra, out=base / f"{name}.out") for name, extra in (("a", ()), ("b", flaky))
    }
    handles: dict[str, str] = {}
    try:
        deadline = time.time() + 500
        while any(job.alive() for job in jobs.values()) and time.time() < deadline:
            for name, job in jobs.items():
                if name not in handles and job.alive() and (h := _weights_handle(base / name)):
                    handles[name] = h  # seen while the job runs: its trainer published into it
            time.sleep(0.2)
        codes = {name: job.wait(timeout=max(1, deadline - time.time())) for name, job in jobs.items()}
    finally:
        for job in jobs.values():
            job.stop(signal.SIGTERM)
    outputs = {name: job.output() for name, job in jobs.items()}
    return {"base": base, "codes": codes, "outputs": outputs, "handles": handles}


@pytest.mark.timeout(600)
def test_two_default_jobs_of_one_name_both_finish_exactly(two_runs):
    for name in ("a", "b"):
        assert two_runs["codes"][name] == 0, two_runs["outputs"][name][-4000:]
        run_dir = two_runs["base"] / name
        assert steps(run_dir) == list(range(1, STEPS + 1))
        s = summary(run_dir)
        assert_exact(s, in_flight_ok=False)
        assert s["trained_steps"] == STEPS and s["checkpointed_version"] == STEPS
    handles = two_runs["handles"]
    assert set(handles) == {"a", "b"}, handles
    roots = {name: Path(h).parent for name, h in handles.items()}
    assert roots["a"] != roots["b"], f"both jobs published weights into {roots['a']}"
    assert not any(r.exists() for r in roots.values()), f"weights left behind: {roots}"


@pytest.mark.timeout(120)
def test_flaky_reward_with_on_error_score_trains_its_groups(two_runs):
    run_dir, out = two_runs["base"] / "b", two_runs["outputs"]["b"]
    assert all(r["failed"] == 0 for r in metrics(run_dir))
    s = summary(run_dir)
    assert s["failed"] == 0 and s["dead_lettered"] > 0, s  # the raising calls, scored and trained
    failures = [ln for ln in out.splitlines() if ln.startswith("failures: ")]
    assert any("reward function raised RuntimeError: " in ln for ln in failures), out[-3000:]
    print(f"dead-lettered {s['dead_lettered']} rollouts, trained {s['trained']} groups")


@pytest.mark.timeout(600)
def test_reusing_a_run_dir_without_resume_is_refused(two_runs):
    run_dir = two_runs["base"] / "a"
    before = {f: (run_dir / f).read_bytes() for f in ("config.yaml", "metrics.jsonl", "summary.json")}
    res = up(run_dir, "trainer.steps=5", timeout=400)
    assert res.returncode == 2, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"--resume {run_dir}" in res.stderr and "another --run-dir" in res.stderr, res.stderr
    assert {f: (run_dir / f).read_bytes() for f in before} == before, "the refused `up` changed the run dir"


@pytest.mark.timeout(120)
def test_scale_on_a_finished_run_shows_its_summary_and_writes_nothing(two_runs):
    run_dir = two_runs["base"] / "a"
    res = run_cli("scale", "generator=2", "--run-dir", str(run_dir))
    assert res.returncode == 1, res.stdout + res.stderr
    s = summary(run_dir)
    assert "has finished" in res.stderr and str(run_dir / "summary.json") in res.stderr, res.stderr
    assert f"groups admitted {s['admitted']} = trained {s['trained']}" in res.stderr, res.stderr
    assert not (run_dir / "scale.json").exists()


@pytest.mark.timeout(120)
def test_status_on_a_finished_run_shows_its_summary(two_runs):
    run_dir = two_runs["base"] / "b"
    t0 = time.time()
    res = run_cli("status", "--run-dir", str(run_dir), "--once")
    assert res.returncode == 0, res.stdout + res.stderr
    s = summary(run_dir)
    assert "has finished" in res.stdout and f"{STEPS} steps trained" in res.stdout, res.stdout
    assert f"groups admitted {s['admitted']} = trained {s['trained']}" in res.stdout and "invariant holds" in res.stdout
    assert "redis-server" not in res.stdout + res.stderr
    assert time.time() - t0 < 30, "no broker retries for a finished run"
