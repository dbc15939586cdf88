"""`streamrl bench trainer_mfu` on CPU (the README's smoke run): --out is created up front, a bad --out
fails before the run, and nothing is written into the working directory.

    pytest tests/integration/test_bench_trainer_mfu.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]


def _bench(cwd: Path, model: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "streamrl.cli", "bench", "trainer_mfu", "--config",
           str(ROOT / "configs/qwen3-1.7b-train.yaml"), "--shape", "qwen3-tiny", "--device", "cpu",
           "--set", f"model.path={model}", "--rows", "8", "--prompt-len", "8", "--completion-len", "8",
           "--variants", "hf", "--warmup", "0", "--steps", "1", *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=280)


def test_out_dir_is_created_and_the_cwd_stays_clean(tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    out = tmp_path / "not" / "there"
    proc = _bench(cwd, tmp_path / "model", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((out / "result.json").read_text())
    assert result["results"]["hf"]["tokens_per_s"] > 0
    assert (out / "trainer_mfu_hf.json").exists()
    assert list(cwd.iterdir()) == []

    proc = _bench(cwd, tmp_path / "model")  # no --out: the per-variant files are scratch
    assert proc.returncode == 0, proc.stdout + proc.stderr
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
