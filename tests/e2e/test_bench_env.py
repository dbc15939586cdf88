"""`streamrl bench env` runs the multi-turn job streaming and as a synchronous turn loop at a fixed env
latency and prints the table; at 500 ms the streaming job must train faster (the full measurement,
with its 2x, is in docs/performance.md: more steps than a test can afford).

    pytest tests/e2e/test_bench_env.py -m slow
"""

from __future__ import annotations

import json

import pytest

from bench.jobs import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_env_bench_prints_stream_vs_sync(tmp_path):
    out = tmp_path / "out"
    proc = run_cli("bench", "env", "--latencies", "500", "--steps", "3", "--out", str(out), timeout=880)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "trained_tok_s" in proc.stdout and "generator_busy" in proc.stdout and "stream/sync" in proc.stdout
    result = json.loads((out / "result.json").read_text())
    rows = {r["job"]: r for r in result["rows"]}
    assert set(rows) == {"stream", "sync"} and all(r["env_latency_ms"] == 500 for r in rows.values())
    assert rows["sync"]["env_step_p50_ms"] >= 500 and rows["stream"]["env_step_p50_ms"] >= 500
    assert all(0 < r["generator_busy"] <= 1 and r["turns_mean"] == 2 for r in rows.values())
    assert rows["stream"]["trained_tok_s"] > rows["sync"]["trained_tok_s"], rows
