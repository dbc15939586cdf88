"""`streamrl up --config configs/tiny-lora-cpu.yaml` end to end: the trainer trains LoRA adapters only,
each version publishes only the adapter, the generator serves it as a vLLM LoRA version, the reward
rises as the full-weight tiny job's does, nothing is lost or trained twice with no reference worker (the
trainer computes the KL reference with the adapter disabled), and the run's export holds the merged
model and the PEFT adapter.
"""

import numpy as np
import pytest

from bench.jobs import log_events, metrics, up

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_up_learns_with_lora_publishing_only_the_adapter(tmp_path):
    run_dir = tmp_path / "lora"
    # STREAMRL_CACHE is the session's (tests/e2e/conftest.py), inherited
    res = up(run_dir, "trainer.steps=40", config="tiny-lora-cpu.yaml", timeout=880)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 41))
    first, last = np.mean([r["reward_mean"] for r in rows[:10]]), np.mean([r["reward_mean"] for r in rows[-10:]])
    assert last - first >= 0.3, f"reward did not rise enough: first10={first:.3f} last10={last:.3f}"
    out = res.stdout + res.stderr
    assert "double-trained rollouts 0" in out and "lost 0" in out
    # The KL reference is the trainer's own model with the adapter disabled: no reference process ran.
    assert "source: trainer" in (run_dir / "config.yaml").read_text()
    assert not list((run_dir / "logs").glob("reference-*")) and any((run_dir / "logs").glob("reward-*"))
    assert max(r["kl"] for r in rows) > 0  # ... and the KL term had its reference all the same
    # Every publish is the adapter: a fraction of the tiny model's float32 weights.
    model_bytes = sum(p.stat().st_size for p in (run_dir / "hf").glob("*.safetensors"))
    published = [e["bytes"] for e in log_events(run_dir, "trainer-0") if e.get("event") == "weights_published"]
    assert len(published) >= 40 and max(published) < model_bytes / 3
    assert (run_dir / "hf" / "config.json").is_file() and (run_dir / "hf" / "adapter" / "adapter_config.json").is_file()
