"""`streamrl up` end to end on the tiny CPU config: real broker, vLLM, reward, reference, FSDP trainer.

Runs the CLI as users do (a subprocess), then checks the run's outputs.
"""

import pytest

from bench.jobs import metrics, up

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_up_learns_asynchronously(tmp_path):
    run_dir = tmp_path / "async"
    res = up(run_dir, "trainer.steps=40", "rollout.max_staleness=2")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
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
    assert "step" in res.stdout and "reward" in res.stdout
    # the start-up is not silence: each role is said ready (a generator with its engine's start time)
    # before the first step (streamrl/launch/startup_watch.py)
    out = res.stdout
    first_step = out.index("step    1/")
    assert -1 < out.find("trainer-0 ready, ") < first_step, out[:first_step]
    assert -1 < out.find("generator-0 ready, ") < first_step, out[:first_step]
    assert "(vLLM engine start " in out[out.find("generator-0 ready, ") : first_step]
    assert (run_dir / "logs" / "trainer-0.jsonl").exists() and (run_dir / "logs" / "generator-0.jsonl").exists()
    assert f"model: {run_dir / 'hf'}" in res.stdout and (run_dir / "hf" / "config.json").is_file()  # run.export
    # issue 43: the tiny model has no chat template, so its prompts stay raw text (and this job learns as
    # before), said at start; a short step line with an ETA, the full one in logs/steps.log; no progress bars
    assert "prompts: raw text (the model's tokenizer has no chat template; task.chat_template=auto)" in out
    step40 = next(line for line in out.splitlines() if line.startswith("step   40/40 "))
    assert " busy " not in step40 and "t=" not in step40 and len(step40) <= 160, step40
    assert "ETA " in next(line for line in out.splitlines() if line.startswith("step   39/40 "))
    logged = (run_dir / "logs" / "steps.log").read_text().splitlines()
    assert len(logged) == 40 and any("generators " in ln and ", busy " in ln for ln in logged), logged[-1]
    bar = "Loading weights:"  # transformers' tqdm bar (vLLM's "Loading weights took 0.1 seconds" is a log line)
    assert bar not in out + res.stderr, out
    assert all(bar not in log.read_text(errors="replace") for log in (run_dir / "logs").glob("*.out"))


def test_bad_config_fails_before_anything_starts(tmp_path):
    run_dir = tmp_path / "bad"
    res = up(run_dir, "trainer.stepz=3", timeout=120)
    assert res.returncode == 2
    assert "trainer.stepz" in res.stderr and "unknown field" in res.stderr
    assert not (run_dir / "broker").exists()
