"""`streamrl up` with evaluation during training and an objective from a module outside the repository.

    flock /tmp/streamrl-heavy.lock pytest -q tests/e2e/test_eval.py

The tiny charclass job, 30 steps, an eval round at versions 0, 10, 20 and 30 (8 prompts x 4 samples),
trained with `loss.name=ext_losses.pg:clipped_pg` written into a temporary directory and put on
PYTHONPATH. Proves: the objective trains the task, eval/pass@k is in metrics.jsonl and rises, eval
completions never reach a batch (every row trains exactly 64 samples) and the accounting holds.
"""

import textwrap

import pytest

from bench.jobs import ROOT, metrics, summary, up, with_pythonpath

pytestmark = pytest.mark.slow

LOSS_MODULE = '''
"""PPO-clip written outside streamrl, loaded with loss.name=ext_losses.pg:clipped_pg."""
import torch
from streamrl.losses.core import log_ratio, ppo_clip

def clipped_pg(cfg, inp):
    ratio = torch.exp(log_ratio(inp.logprobs, inp.old_logprobs, cfg.log_ratio_clamp))
    return ppo_clip(ratio, inp.advantages[:, None], cfg.eps_low, cfg.eps_high)
'''


@pytest.mark.timeout(600)
def test_eval_rises_and_an_external_loss_trains(tmp_path):
    ext = tmp_path / "outside"
    (ext / "ext_losses").mkdir(parents=True)
    (ext / "ext_losses" / "__init__.py").write_text("")
    (ext / "ext_losses" / "pg.py").write_text(textwrap.dedent(LOSS_MODULE))
    run_dir = tmp_path / "run"
    # lr 5e-3 (the tiny model's tuning value) learns the task within 30 steps.
    sets = [
        "trainer.steps=30",
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
    res = up(run_dir, *sets, timeout=540, env=with_pythonpath(ROOT, ext))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 31))
    assert all(r["samples"] == 64 for r in rows), "eval completions must never be trained"
    first = sum(r["reward_mean"] for r in rows[:10]) / 10
    last = sum(r["reward_mean"] for r in rows[-10:]) / 10
    evals = [r for r in rows if "eval/step" in r]
    shown = [{k: round(v, 3) for k, v in r.items() if k.startswith("eval/")} for r in evals]
    print("eval rows:", shown, "rewards:", [round(r["reward_mean"], 3) for r in rows])
    assert last - first >= 0.3, f"the external objective did not train: first10={first:.3f} last10={last:.3f}"
    assert [r["eval/step"] for r in evals] == [0, 10, 20, 30], shown  # 30: the final weights (eval.at_end)
    assert rows[-1]["eval/step"] == 30
    for r in evals:
        assert {"eval/pass@1", "eval/pass@2", "eval/pass@4", "eval/mean@4", "eval/maj@4"} <= set(r)
        assert r["eval/prompts"] == 8 and r["eval/version_min"] >= r["eval/step"]
    pass1 = [r["eval/pass@1"] for r in evals]
    mean = [r["eval/mean@4"] for r in evals]
    assert pass1[-1] - pass1[0] >= 0.2 and mean[-1] - mean[0] >= 0.2, (pass1, mean)
    assert "eval/pass@1" in res.stdout  # the console's step line

    s = summary(run_dir)
    assert s["invariant_holds"] and s["unknown_outcomes"] == 0, s
    assert s["trained_rollouts"] == 30 * 64
