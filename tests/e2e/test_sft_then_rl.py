"""`streamrl sft` then `streamrl up` from its export, as users run them (subprocesses, tiny CPU model).

RL from scratch on charclass starts at a mean reward of ~0.19 over its first 10 steps (docs/performance.md);
after SFT on the offline demonstrations the first 10 RL steps must already average >= 0.7.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "streamrl.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.timeout(400)
def test_rl_from_sft_starts_where_rl_from_scratch_ends(tmp_path):
    sft_dir, rl_dir = tmp_path / "sft", tmp_path / "rl"
    res = cli("sft", "--config", str(ROOT / "configs" / "tiny-sft-cpu.yaml"), "--run-dir", str(sft_dir))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    sft = rows(sft_dir)
    assert [r["step"] for r in sft] == list(range(1, 41)) and "sft step   40/40" in res.stdout
    evals = [r["eval_loss"] for r in sft if "eval_loss" in r]
    assert len(evals) == 4 and evals[-1] < evals[0]
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in (sft_dir / "hf").iterdir()
    }

    res = cli(
        "up",
        "--config",
        str(ROOT / "configs" / "tiny-cpu.yaml"),
        "--run-dir",
        str(rl_dir),
        "--set",
        f"model.path={sft_dir / 'hf'}",
        "--set",
        "trainer.steps=10",
        "--set",
        "loss.kl_beta=0",
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rl = rows(rl_dir)
    first10 = sum(r["reward_mean"] for r in rl[:10]) / 10
    print(f"RL from SFT: mean reward of the first 10 steps {first10:.3f}")
    assert len(rl) == 10 and first10 >= 0.7, f"first 10 RL steps from the SFT model: {first10:.3f}"
    # `up` exports its end too: the RL model is a loadable Hugging Face folder.
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(rl_dir / "hf").config.vocab_size == 100
