"""The tiny CPU job end to end (real broker, vLLM, reward, reference, FSDP trainer), run as a user of the
Python API runs it: `python examples/python_api.py`, whose reward function is defined in the script
(the reward worker imports it by the script's path). The job is `streamrl up`'s (streamrl/launch/job.py),
so this checks what `up` prints and writes too; `up` itself runs in every other e2e test.

    pytest tests/e2e/test_up.py
"""

import json
import subprocess
import sys

import pytest

from bench.jobs import ROOT, metrics, run_cli, summary, up

pytestmark = pytest.mark.slow


@pytest.mark.timeout(1100)
def test_python_api_job_learns_asynchronously(tmp_path):
    run_dir = tmp_path / "async"
    example = ROOT / "examples" / "python_api.py"
    cmd = [sys.executable, str(example), "--run-dir", str(run_dir), "trainer.steps=40", "rollout.max_staleness=2"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=880)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"reward.fn = {example}:score" in res.stdout  # the script's own function, by its path
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
    # the accounting is exact, and the script read it (Result.summary) and the rows (Job.rows) back
    s = summary(run_dir)
    assert s["invariant_holds"] and s["lost"] == 0 and s["double_trained"] == 0
    assert f"python api: 40 steps in {run_dir}; mean reward {first:.3f} (first 10) -> {last:.3f}" in out, out[-2000:]
    assert f"groups admitted {s['admitted']} = trained {s['trained']} + other outcomes; invariant holds: True" in out
    assert f"python api: model {run_dir / 'hf'}" in out
    # `streamrl eval` on this run's newest checkpoint (no job of its own: one engine in-process)
    ev = run_cli("eval", str(run_dir), "--set", "eval.num_prompts=8", timeout=300)
    assert ev.returncode == 0, ev.stdout[-3000:] + ev.stderr[-3000:]
    assert "step 40: pass@1 " in ev.stdout and "pass@8 " in ev.stdout and "mean@8 " in ev.stdout, ev.stdout
    out_dir = run_dir / "eval" / "step-40"
    rec = json.loads((out_dir / "metrics.json").read_text())
    samples = [json.loads(ln) for ln in (out_dir / "samples.jsonl").read_text().splitlines()]
    assert rec["step"] == 40 and rec["eval/prompts"] == 8 and len(samples) == 8 * 8
    assert {(r["group_id"], r["sample"]) for r in samples} == {
        (f"eval-40-8-{i}", s) for i in range(8) for s in range(8)
    }
    # the trained weights were loaded: they score above the run's first steps (generator.temperature, as in training)
    assert rec["eval/mean@8"] > first + 0.15, (rec, first)
    assert not list((run_dir / "eval").glob(".model-*"))  # the exported weights are removed
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
