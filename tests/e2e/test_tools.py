"""Tool calls end to end: `streamrl up --config configs/tiny-tools-cpu.yaml` for the fewest steps
that show real python-tool calls executed by the env worker and counted in metrics.jsonl.

    pytest tests/e2e/test_tools.py
"""

from __future__ import annotations

import pytest

from bench.jobs import metrics, summary, up

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_tiny_tools_job_executes_tool_calls(tmp_path):
    run_dir = tmp_path / "tools"
    res = up(run_dir, "trainer.steps=2", "run.export=false", config="tiny-tools-cpu.yaml", timeout=280)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        # max_turns=2 and every turn is a python call: each of the 16 episodes made 1 or 2 calls
        assert 16 <= r["tool_calls"] <= 32, r
        assert 0 <= r["tool_errors"] <= r["tool_calls"]
        assert r["turns_mean"] > 1 and r["env_tokens"] > 0 and r["episodes_failed"] == 0
    s = summary(run_dir)
    assert s["invariant_holds"] and s["lost"] == 0
