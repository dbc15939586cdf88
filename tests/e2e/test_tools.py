"""Tool calls end to end: `streamrl up --config configs/tiny-tools-cpu.yaml` for the fewest steps
that show real python-tool calls executed by the env worker and counted in metrics.jsonl.

    pytest tests/e2e/test_tools.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "tiny-tools-cpu.yaml"
pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_tiny_tools_job_executes_tool_calls(tmp_path):
    run_dir = tmp_path / "tools"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "streamrl.cli",
            "up",
            "--config",
            str(CONFIG),
            "--run-dir",
            str(run_dir),
            "--set",
            "trainer.steps=2",
            "--set",
            "run.export=false",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        # max_turns=2 and every turn is a python call: each of the 16 episodes made 1 or 2 calls
        assert 16 <= r["tool_calls"] <= 32, r
        assert 0 <= r["tool_errors"] <= r["tool_calls"]
        assert r["turns_mean"] > 1 and r["env_tokens"] > 0 and r["episodes_failed"] == 0
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["invariant_holds"] and s["lost"] == 0
