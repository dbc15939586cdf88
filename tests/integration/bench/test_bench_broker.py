"""`streamrl bench broker` on tiny settings: it runs every role process and writes well-formed
result.json and a plot (its speed is the bench's business, not the test's).

    pytest tests/integration/bench/test_bench_broker.py
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)


def _bench(tmp_path, *extra: str, rollouts: int = 96, groups_per_step: int = 2) -> dict:
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "streamrl.cli",
            "bench",
            "broker",
            "--rollouts",
            str(rollouts),
            "--groups-per-step",
            str(groups_per_step),
            "--completion-tokens",
            "32",
            "--prompt-tokens",
            "8",
            "--group-size",
            "4",
            "--out",
            str(out),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rollouts_per_s" in proc.stdout
    return json.loads((out / "result.json").read_text()), out, proc.stdout


def test_broker_bench_writes_result_and_plot(tmp_path):
    result, out, stdout = _bench(tmp_path, "--rate", "400", "--consumers", "1")
    assert {"rollouts_per_s", "p50_ms", "p99_ms", "mb_per_s", "baseline_rollouts_per_s", "runs"} <= set(result)
    assert [r["mode"] for r in result["runs"]] == ["plain", "full", "full"]
    assert result["latency_rate"] == 400
    for r in result["runs"]:
        assert r["rollouts"] == 96 and r["rollouts_per_s"] > 0
        assert 0 < r["p50_ms"] <= r["p99_ms"] <= r["max_ms"]
    full = result["runs"][1]
    assert set(full["cpu_s"]) == {"generator", "trainer", "reward", "reference", "ext0", "redis-server"}
    assert full["assembler"]["failed"] == 0  # every group joined: reward + ref_logprobs for all 96
    assert (out / "broker.png").stat().st_size > 0
    assert "plain XADD/XREAD pair" in stdout and "full path @ 400/s" in stdout
    assert "over unix" in stdout  # the roles connect as those of `streamrl up` do


def test_broker_bench_trims_what_the_trainer_consumed(tmp_path):
    """As a job's trainer: entries every group consumed are trimmed while the run goes on."""
    result, _, _ = _bench(tmp_path, "--rate", "100", "--no-baseline", "--trim-every-s", "0.1")
    limited = result["runs"][1]  # ~1 s at 100/s: several trim passes
    assert limited["rollouts"] == 96 and limited["assembler"]["failed"] == 0
    assert sum(limited["trimmed"]) > 0, limited["trimmed"]


def test_broker_bench_trainer_stage_has_the_trainers_traffic(tmp_path):
    """As workers/trainer.py: whole steps of groups_per_step groups, each logged and announced, and the
    acks only at each checkpoint (every trainer.checkpoint_every = 10 steps) and at the end."""
    result, _, stdout = _bench(tmp_path, "--rate", "0", "--no-baseline", rollouts=94, groups_per_step=1)
    full = result["runs"][0]
    assert "rounded up to 96" in stdout  # 94 rollouts are 23.5 steps of one group of 4
    assert full["rollouts"] == 96 and full["assembler"]["failed"] == 0
    assert full["trainer_steps"] == 24
    assert full["ack_rounds"] == 3  # after steps 10 and 20, and at the end
