"""`streamrl bench trainer_mfu` on CPU (docs/performance.md's smoke run, tiny Qwen3 shape): --out is created up
front, a bad --out fails before the run, nothing is written into the working directory; the chunked vs
full-logits and token-budget variants side by side, the checkpoint timings (the GPU run's code path) and a
profiled step, in one run.

Checks the bench runs and reports what it claims to measure; the timings themselves are the bench's
output, not asserted (a shared CI machine's seconds mean nothing).

    pytest tests/integration/bench/test_bench_trainer_mfu.py
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[3]


def _bench(cwd: Path, model: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "streamrl.cli",
        "bench",
        "trainer_mfu",
        "--config",
        str(ROOT / "configs/qwen3-1.7b-train.yaml"),
        "--shape",
        "qwen3-tiny",
        "--device",
        "cpu",
        "--set",
        f"model.path={model}",
        "--rows",
        "8",
        "--prompt-len",
        "8",
        "--completion-len",
        "8",
        "--variants",
        "hf",
        "--warmup",
        "0",
        "--steps",
        "1",
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=280)


def test_without_out_the_cwd_stays_clean(tmp_path):
    """No --out: the per-variant files are scratch (--out is created up front: the smoke test below)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = _bench(cwd, tmp_path / "model")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "hf: step " in proc.stdout and " tok/s " in proc.stdout, proc.stdout[-2000:]
    assert list(cwd.iterdir()) == []


def test_unwritable_out_fails_before_the_run(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    t0 = time.monotonic()
    proc = _bench(tmp_path, tmp_path / "model", "--out", str(blocker / "sub"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"--out {blocker / 'sub'}: cannot write there" in proc.stderr
    assert "rows x" not in proc.stdout  # the bench never started
    assert not (tmp_path / "model").exists()
    assert time.monotonic() - t0 < 60


def test_bench_trainer_mfu_cpu_smoke(tmp_path: Path):
    """Also: --out (two folders deep, not there yet) is created, and nothing is written into the cwd.
    --profile on the same run (a run of its own cost a start-up): one profiled step's kernel time by
    category adds up, each category >= 0, the idle time is the step's rest, and the chrome trace is kept
    in --out; --prompt-jitter and --job-warm-up (the real job's row shape and start-up) run on the same path."""
    from bench.trainer_profile import CATEGORIES

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cwd, out = tmp_path / "cwd", tmp_path / "not" / "there"
    cwd.mkdir()
    cmd = [
        sys.executable,
        "-m",
        "streamrl.cli",
        "bench",
        "trainer_mfu",
        "--out",
        str(out),
        "--config",
        str(ROOT / "configs" / "qwen3-1.7b-train.yaml"),
        "--shape",
        "qwen3-tiny",
        "--device",
        "cpu",
        "--set",
        f"model.path={tmp_path / 'model'}",
        "--rows",
        "8",
        "--prompt-len",
        "8",
        "--completion-len",
        "24",
        "--ragged",
        "--warmup",
        "0",
        "--steps",
        "1",
        "--checkpoint",
        "--checkpoint-dir",
        str(tmp_path),
        "--publish",
        "--variants",
        "hf,hf+nochunk+mbt=64",
        "--profile",
        "--prompt-jitter",
        "3",
        "--job-warm-up",
    ]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert list(cwd.iterdir()) == []
    assert (out / "trainer_mfu_hf.json").exists() and (out / "trainer_mfu_hf_nochunk_mbt64.json").exists()
    assert "checkpoint: blocking save" in proc.stdout and "publish (pack on the device)" in proc.stdout
    r = json.loads((out / "result.json").read_text())
    assert r["results"]["hf"]["tokens_per_s"] > 0
    chunked, full = r["results"]["hf"], r["results"]["hf+nochunk+mbt=64"]
    # Same batch, same weights: chunking and packing change the memory and padding, not the step.
    assert chunked["grad_norm"] == pytest.approx(full["grad_norm"], rel=1e-4)
    assert chunked["input_tokens"] == full["input_tokens"] == r["tokens_per_step"]
    assert full["padded_tokens"] < chunked["padded_tokens"]
    for v in (chunked, full):
        assert v["checkpoint_sync_stall_s"] > 0 and len(v["checkpoint_async_stall_s"]) == 2
        assert v["checkpoint_prepare_s"] > 0  # the staging buffers, allocated before the first save
        assert len(v["publish_stream_s"]) == len(v["publish_whole_s"]) == 3
        assert all(w >= s for s, w in zip(v["checkpoint_async_stall_s"], v["checkpoint_async_write_s"]))
    assert not list(tmp_path.glob("trainer_mfu_ckpt_*")), "the timed checkpoints are deleted"

    assert "profiled step" in proc.stdout and "logsoftmax_loss" in proc.stdout
    assert r["prompt_jitter"] == 3
    p = r["results"]["hf"]["profile"]
    assert set(p["categories"]) == set(CATEGORIES)
    assert all(v >= 0 for v in p["categories"].values())
    assert sum(p["categories"].values()) == pytest.approx(p["kernel_ms"], rel=1e-9)
    assert p["kernel_ms"] > 0 and p["kernels"] > 0
    assert p["categories"]["gemm"] > 0 and p["categories"]["logsoftmax_loss"] > 0 and p["categories"]["optimizer"] > 0
    assert 0 < p["busy_ms"] <= p["step_ms"]
    assert p["idle_ms"] == pytest.approx(p["step_ms"] - p["busy_ms"]) and p["idle_ms"] >= 0
    trace = json.loads(gzip.decompress(Path(p["trace"]).read_bytes()))
    assert Path(p["trace"]).parent == out and trace["traceEvents"]


def test_variant_options_set_the_trainer_section():
    from bench.trainer_variants import apply_variant
    from streamrl.config.schema import Config
    from streamrl.core.errors import ConfigError

    cfg = Config()
    apply_variant(cfg, "torchtitan+ac+nochunk+mbt=4096+mbs=64")
    t = cfg.trainer
    assert (t.backend, t.activation_checkpointing, t.parallelism.compile) == ("torchtitan", True, False)
    assert (t.logprob_chunk_tokens, t.micro_batch_tokens, t.micro_batch_size) == (0, 4096, 64)
    apply_variant(cfg, "torchtitan+compile+bucket=32+pack=2048")
    assert (cfg.trainer.seq_bucket, cfg.trainer.pack_rows, cfg.trainer.parallelism.compile) == (32, 2048, True)
    cfg = Config()
    apply_variant(cfg, "hf+chunk=512+kernel=eager")
    assert cfg.trainer.logprob_chunk_tokens == 512 and cfg.trainer.backend == "hf"
    assert cfg.trainer.logprob_kernel == "eager"
    assert not cfg.trainer.lora.enabled
    apply_variant(cfg, "hf+lora=16")
    assert cfg.trainer.lora.rank == 16 and cfg.trainer.lora.enabled
    with pytest.raises(ConfigError, match="unknown option 'chunks=3'"):
        apply_variant(cfg, "hf+chunks=3")
