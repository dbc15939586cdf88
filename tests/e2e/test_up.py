"""`streamrl up` end to end on the tiny CPU config: real broker, vLLM, reward, reference, FSDP trainer.

Runs the CLI as users do (a subprocess), then checks the run's outputs. The learning job is run by
`streamrl bench e2e`, which starts `streamrl up` as a user does and summarizes the finished job into
result.json: one job shows both that the job learns and that the benchmark reads a real job right
(once a job of its own each: a job's start-up is most of a short job's time).
"""

import json

import pytest

from bench.jobs import metrics, run_cli, up

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_up_learns_asynchronously_and_bench_e2e_summarizes_it(tmp_path):
    out = tmp_path / "out"
    res = run_cli(
        "bench",
        "e2e",
        "--steps",
        "40",
        "--no-sync",
        "--out",
        str(out),
        "--set",
        "rollout.max_staleness=2",
        "--set",
        "run.export=true",  # the benchmark's own default is false: the export is checked here
        timeout=880,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    run_dir = out / "runs" / "async"
    text = (out / "runs" / "async.out").read_text()  # `streamrl up`'s output (stdout and stderr)
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 41))
    for r in rows:
        for key in (
            "step",
            "policy_version",
            "reward_mean",
            "samples",
            "tokens",
            "staleness_max",
            "staleness_hist",
            "time_s",
            "train_tflops",  # streamrl/train/flops.py (mfu too, on a GPU of known peak)
        ):
            assert key in r
        assert r["staleness_max"] <= 2
        assert sum(r["staleness_hist"].values()) == r["samples"] == 64
    assert max(r["staleness_max"] for r in rows) >= 1, "an async run should train on some stale data"
    assert sum(r["overlap_rollouts"] for r in rows) > 0, "generation should overlap training"
    assert any(r.get("gen_tokens_per_s", 0) > 0 for r in rows), "the generators' decode rate (heartbeats)"
    first = sum(r["reward_mean"] for r in rows[:10]) / 10
    last = sum(r["reward_mean"] for r in rows[-10:]) / 10
    assert last - first >= 0.3, f"reward did not rise enough: first10={first:.3f} last10={last:.3f}"
    assert "step" in text and "reward" in text
    # the start-up is not silence: each role is said ready (a generator with its engine's start time)
    # before the first step (streamrl/launch/startup_watch.py)
    first_step = text.index("step    1/")
    assert -1 < text.find("trainer-0 ready, ") < first_step, text[:first_step]
    assert -1 < text.find("generator-0 ready, ") < first_step, text[:first_step]
    assert "(vLLM engine start " in text[text.find("generator-0 ready, ") : first_step]
    assert (run_dir / "logs" / "trainer-0.jsonl").exists() and (run_dir / "logs" / "generator-0.jsonl").exists()
    assert f"model: {run_dir / 'hf'}" in text and (run_dir / "hf" / "config.json").is_file()  # run.export

    # The benchmark's summary of the same job (bench/e2e.py): well-formed result.json and plots.
    result = json.loads((out / "result.json").read_text())
    (run,) = result["runs"]
    assert run["mode"] == "async" and run["steps"] == 40 and run["max_staleness"] == 2
    assert run["trained_tokens_per_s"] > 0 and run["generated_tokens_per_s"] > 0
    assert 0 < run["busy"]["trainer"] <= 1 and 0 <= run["busy"]["generator:generator-0"] <= 1
    assert sum(run["staleness_hist_tokens"].values()) == run["trained_tokens"]
    assert max(int(k) for k in run["staleness_hist_tokens"]) <= 2
    assert 0 < run["first_step_s"] < run["wall_s"]  # up launched -> step 1's log line
    assert result["speedup"] is None  # no sync job was run
    assert (out / "e2e.png").is_file() and (out / "plots" / "async" / "staleness.png").is_file()


def test_bad_config_fails_before_anything_starts(tmp_path):
    run_dir = tmp_path / "bad"
    res = up(run_dir, "trainer.stepz=3", timeout=120)
    assert res.returncode == 2
    assert "trainer.stepz" in res.stderr and "unknown field" in res.stderr
    assert not (run_dir / "broker").exists()
