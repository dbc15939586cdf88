"""`streamrl sft` then `streamrl up` from its export, as users run them (subprocesses, tiny CPU model).

RL from scratch on charclass starts at a mean reward of ~0.19 over its first 10 steps (docs/performance.md);
after SFT on the offline demonstrations the first 10 RL steps must already average >= 0.7.
The RL job's generator is one vLLM engine of two tensor-parallel workers (generator.tensor_parallel_size=2),
switching to each published version (tests/integration/generate/test_generator_tp.py checks each worker's
weights); the accounting stays exact.
"""

import pytest

from bench.jobs import config_path, metrics, run_cli, up

pytestmark = pytest.mark.slow


@pytest.mark.timeout(500)
def test_rl_from_sft_starts_where_rl_from_scratch_ends(tmp_path):
    sft_dir, rl_dir = tmp_path / "sft", tmp_path / "rl"
    res = run_cli("sft", "--config", str(config_path("tiny-sft-cpu.yaml")), "--run-dir", str(sft_dir), timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    sft = metrics(sft_dir)
    assert [r["step"] for r in sft] == list(range(1, 41)) and "sft step   40/40" in res.stdout
    assert "Loading weights:" not in res.stdout + res.stderr  # no transformers progress bar (issue 43)
    evals = [r["eval_loss"] for r in sft if "eval_loss" in r]
    assert len(evals) == 4 and evals[-1] < evals[0]
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in (sft_dir / "hf").iterdir()
    }

    # Weights through a shared folder (`dir`, the simplest multi-host path) into a TP=2 generator in this job.
    tp = "generator.tensor_parallel_size=2"
    sets = (f"model.path={sft_dir / 'hf'}", "trainer.steps=10", "loss.kl_beta=0", "weights.backend=dir", tp)
    res = up(rl_dir, *sets, timeout=380)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "Worker_TP1" in (rl_dir / "logs" / "generator-0.out").read_text()  # the engine's second TP worker ran
    out = res.stdout + res.stderr
    assert "double-trained rollouts 0" in out and "lost 0" in out
    rl = metrics(rl_dir)
    first10 = sum(r["reward_mean"] for r in rl[:10]) / 10
    print(f"RL from SFT: mean reward of the first 10 steps {first10:.3f}")
    assert len(rl) == 10 and first10 >= 0.7, f"first 10 RL steps from the SFT model: {first10:.3f}"
    assert any((rl_dir / "weights").iterdir())  # the versions went through the folder
    # `up` exports its end too: the RL model is a loadable Hugging Face folder.
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(rl_dir / "hf").config.vocab_size == 100
