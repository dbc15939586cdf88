"""`streamrl bench pipeline` on tiny settings: the real feeder, reward worker and Assembler with the
simulated generator/trainer; well-formed rows, and the staleness bound holds in every run.

    pytest tests/integration/bench/test_bench_pipeline.py
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(150)


def test_pipeline_bench_rows_and_staleness_bound(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "streamrl.cli",
            "bench",
            "pipeline",
            "--staleness",
            "0",
            "2",
            "--steps",
            "4",
            "--warmup",
            "1",
            "--tokens",
            "8",
            "--token-ms",
            "4",
            "--train-s",
            "0.032",
            "--group-size",
            "2",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=140,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # every simulated role stops cleanly (its `stopped` line once died on Worker.busy being shadowed)
    assert "Traceback" not in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert [r["max_staleness"] for r in result["rows"]] == [0, 2]
    for row in result["rows"]:
        assert {"throughput", "ideal", "gen_busy", "train_busy", "ratio", "speedup"} <= set(row)
        assert row["throughput"] > 0 and 0 <= row["gen_busy"] <= 1 and 0 <= row["train_busy"] <= 1
        assert max(int(k) for k in row["staleness_hist"]) <= row["max_staleness"]
        assert sum(row["staleness_hist"].values()) == 4 * 2 * 2  # steps * groups_per_step * group_size
    assert result["rows"][0]["staleness_hist"] == {"0": 16}  # synchronous: every token on-policy
    assert result["speedup_theory"] == pytest.approx(2.0, rel=0.01)  # balanced stages by default
    assert (out / "pipeline.png").stat().st_size > 0
