"""A signal stops `streamrl sft` at a step boundary with a checkpoint of that step; --resume goes on.

pytest tests/integration/sft/test_sft_stop.py
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from streamrl.train.checkpoint import list_checkpoints

ROOT = Path(__file__).resolve().parents[3]


def _rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def test_sigterm_checkpoints_the_last_step_and_resume_continues(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "STREAMRL_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    base = [sys.executable, "-m", "streamrl.cli", "sft", "--config", str(ROOT / "configs" / "tiny-sft-cpu.yaml")]
    proc = subprocess.Popen(
        base + ["--run-dir", str(run_dir), "--set", "trainer.steps=500", "--set", "trainer.checkpoint_every=1000"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 120
    while len(_rows(run_dir)) < 3 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out[-3000:]
    last = _rows(run_dir)[-1]["step"]
    assert 3 <= last < 500 and f"stopped after step {last} (checkpoint saved)" in out
    assert sorted(list_checkpoints(run_dir)) == [last]  # checkpoint_every=1000: only the stop saved one
    assert not (run_dir / "hf").exists() and not (run_dir / ".stop-requested").exists()

    res = subprocess.run(
        base + ["--resume", str(run_dir), "--set", f"trainer.steps={last + 2}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert [r["step"] for r in _rows(run_dir)] == list(range(1, last + 3))
    assert "resumed from" in res.stdout and (run_dir / "hf" / "config.json").is_file()
