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
"""

import textwrap

import pytest
import yaml

from bench.jobs import ROOT, metrics, summary, up, with_pythonpath

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
    run_dir = tmp_path / "titan"
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
    res = up(run_dir, *sets, timeout=540, env=with_pythonpath(ROOT, ext))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
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
    assert "eval/pass@1" in res.stdout  # the console's step line
    # The run's resolved config (what every role read) holds the backend and the 2 ranks.
    trainer = yaml.safe_load((run_dir / "config.yaml").read_text())["trainer"]
    assert trainer["backend"] == "torchtitan" and trainer["world_size"] == 2

    s = summary(run_dir)
    assert s["invariant_holds"] and s["unknown_outcomes"] == 0, s
    assert s["trained_rollouts"] == STEPS * 64
