"""`streamrl up` with the torchtitan trainer backend (FSDP2 over 2 gloo ranks), an objective from a
module outside the repository, and evaluation during training, in one job (each was a job of its
own; start-up is most of such a job's time here).

    pytest tests/e2e/test_titan.py

The tiny charclass job for 30 steps at lr 5e-3 (the tiny config has 3e-3 for 60 steps; 5e-3 shows
the same rise in half the steps) with trainer.backend=torchtitan and trainer.world_size=2 (torchtitan's
Llama 3 with SDPA attention, parallelized by torchtitan's parallelize_llama), trained with
`loss.name=ext_losses.pg:clipped_pg` written into a temporary directory and put on PYTHONPATH, and an
eval round at versions 0, 10, 20 and 30 (8 prompts x 4 samples). Proves: the task learns on the
torchtitan backend under the outside objective, eval/pass@k is in metrics.jsonl and rises, eval
completions never reach a batch (every row trains exactly 64 samples) and the accounting holds.

The job is launched by `streamrl bench e2e --no-sync` (it runs `streamrl up` into OUT/runs/async), so
the same run also shows the bench summarizing a real job into a well-formed result.json and its
plots (a job of its own for the bench cost a start-up, most of such a job's time here).
"""

import json
import textwrap

import pytest
import yaml

from bench.jobs import ROOT, metrics, run_cli, summary, with_pythonpath

pytestmark = pytest.mark.slow

STEPS = 30

LOSS_MODULE = '''
"""PPO-clip written outside streamrl, loaded with loss.name=ext_losses.pg:clipped_pg."""
import torch
from streamrl.losses.core import log_ratio, ppo_clip

def clipped_pg(cfg, inp):
    ratio = torch.exp(log_ratio(inp.logprobs, inp.old_logprobs, cfg.log_ratio_clamp))
    return ppo_clip(ratio, inp.advantages[:, None], cfg.eps_low, cfg.eps_high)
'''


@pytest.mark.timeout(600)
def test_torchtitan_on_two_ranks_learns_an_outside_objective_and_eval_rises(tmp_path):
    ext = tmp_path / "outside"
    (ext / "ext_losses").mkdir(parents=True)
    (ext / "ext_losses" / "__init__.py").write_text("")
    (ext / "ext_losses" / "pg.py").write_text(textwrap.dedent(LOSS_MODULE))
    out = tmp_path / "out"
    sets = [
        "trainer.backend=torchtitan",
        "trainer.world_size=2",
        f"trainer.steps={STEPS}",
        "trainer.lr=0.005",
        "run.export=false",
        "loss.kl_beta=0",
        "loss.name=ext_losses.pg:clipped_pg",
        "eval.every_steps=10",
        "eval.num_prompts=8",
        "eval.samples=4",
        "eval.pass_k=[1,2]",
        "eval.threshold=0.75",
    ]
    args = ["bench", "e2e", "--steps", str(STEPS), "--no-sync", "--out", str(out), "--timeout", "540"]
    res = run_cli(*args, *[a for s in sets for a in ("--set", s)], timeout=580, env=with_pythonpath(ROOT, ext))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run_dir, console = out / "runs" / "async", (out / "runs" / "async.out").read_text()
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(r["skipped_step"] == 0 and r["grad_norm"] > 0 for r in rows)
    assert all(r["samples"] == 64 for r in rows), "eval completions must never be trained"
    first = sum(r["reward_mean"] for r in rows[:10]) / 10
    last = sum(r["reward_mean"] for r in rows[-10:]) / 10
    evals = [r for r in rows if "eval/step" in r]
    shown = [{k: round(v, 3) for k, v in r.items() if k.startswith("eval/")} for r in evals]
    print("eval rows:", shown, "rewards:", [round(r["reward_mean"], 3) for r in rows])
    assert last - first >= 0.3, f"reward did not rise enough: first10={first:.3f} last10={last:.3f}"
    assert [r["eval/step"] for r in evals] == [0, 10, 20, 30], shown  # 30: the final weights (eval.at_end)
    assert rows[-1]["eval/step"] == STEPS
    for r in evals:
        assert {"eval/pass@1", "eval/pass@2", "eval/pass@4", "eval/mean@4", "eval/maj@4"} <= set(r)
        assert r["eval/prompts"] == 8 and r["eval/version_min"] >= r["eval/step"]
    pass1 = [r["eval/pass@1"] for r in evals]
    mean = [r["eval/mean@4"] for r in evals]
    assert pass1[-1] - pass1[0] >= 0.2 and mean[-1] - mean[0] >= 0.2, (pass1, mean)
    assert "eval/pass@1" in console  # the console's step line
    # The run's resolved config (what every role read) holds the backend and the 2 ranks.
    trainer = yaml.safe_load((run_dir / "config.yaml").read_text())["trainer"]
    assert trainer["backend"] == "torchtitan" and trainer["world_size"] == 2

    s = summary(run_dir)
    assert s["invariant_holds"] and s["unknown_outcomes"] == 0, s
    assert s["trained_rollouts"] == STEPS * 64
    assert_bench_summary(out)


def assert_bench_summary(out) -> None:
    """`bench e2e`'s result.json and plots for the one (async) job it ran."""
    result = json.loads((out / "result.json").read_text())
    (run,) = result["runs"]
    assert run["mode"] == "async" and run["steps"] == STEPS and run["max_staleness"] == 1
    assert run["trained_tokens_per_s"] > 0 and run["generated_tokens_per_s"] > 0
    assert 0 < run["busy"]["trainer"] <= 1 and 0 <= run["busy"]["generator:generator-0"] <= 1
    assert sum(run["staleness_hist_tokens"].values()) == run["trained_tokens"]
    assert max(int(k) for k in run["staleness_hist_tokens"]) <= 1
    assert 0 < run["first_step_s"] < run["wall_s"]  # up launched -> step 1's log line
    assert result["speedup"] is None  # no sync job was run
    assert (out / "e2e.png").is_file() and (out / "plots" / "async" / "staleness.png").is_file()
