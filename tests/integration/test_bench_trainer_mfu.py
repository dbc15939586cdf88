"""`streamrl bench trainer_mfu` on CPU with the tiny Qwen3 shape: the chunked vs full-logits and
token-budget variants side by side, and the checkpoint timings (the GPU run's code path).

Checks the bench runs and reports what it claims to measure; the timings themselves are the bench's
output, not asserted (a shared CI machine's seconds mean nothing).

    pytest tests/integration/test_bench_trainer_mfu.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_bench_trainer_mfu_cpu_smoke(tmp_path: Path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "streamrl.cli", "bench", "trainer_mfu", "--out", str(tmp_path / "out"),
           "--config", str(REPO / "configs" / "qwen3-1.7b-train.yaml"), "--shape", "qwen3-tiny", "--device", "cpu",
           "--set", f"model.path={tmp_path / 'model'}", "--rows", "8", "--prompt-len", "8", "--completion-len", "24",
           "--ragged", "--warmup", "0", "--steps", "1", "--checkpoint", "--checkpoint-dir", str(tmp_path),
           "--variants", "hf,hf+nochunk+mbt=64"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=580)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "checkpoint: blocking save" in proc.stdout
    r = json.loads((tmp_path / "out" / "result.json").read_text())
    chunked, full = r["results"]["hf"], r["results"]["hf+nochunk+mbt=64"]
    # Same batch, same weights: chunking and packing change the memory and padding, not the step.
    assert chunked["grad_norm"] == pytest.approx(full["grad_norm"], rel=1e-4)
    assert chunked["input_tokens"] == full["input_tokens"] == r["tokens_per_step"]
    assert full["padded_tokens"] < chunked["padded_tokens"]
    for v in (chunked, full):
        assert v["checkpoint_sync_stall_s"] > 0 and len(v["checkpoint_async_stall_s"]) == 2
        assert all(w >= s for s, w in zip(v["checkpoint_async_stall_s"], v["checkpoint_async_write_s"]))
    assert not list(tmp_path.glob("trainer_mfu_ckpt_*")), "the timed checkpoints are deleted"


def test_variant_options_set_the_trainer_section():
    from bench.trainer_mfu import apply_variant
    from streamrl.config import Config
    from streamrl.errors import ConfigError

    cfg = Config()
    apply_variant(cfg, "torchtitan+ac+nochunk+mbt=4096+mbs=64")
    t = cfg.trainer
    assert (t.backend, t.activation_checkpointing, t.parallelism.compile) == ("torchtitan", True, False)
    assert (t.logprob_chunk_tokens, t.micro_batch_tokens, t.micro_batch_size) == (0, 4096, 64)
    apply_variant(cfg, "hf+chunk=512")
    assert cfg.trainer.logprob_chunk_tokens == 512 and cfg.trainer.backend == "hf"
    with pytest.raises(ConfigError, match="unknown option 'chunks=3'"):
        apply_variant(cfg, "hf+chunks=3")
