"""`streamrl bench peers` runs a real TRL GRPOTrainer job on the streamrl config's workload (here on
the CPU, generating with transformers instead of vLLM: `--no-vllm`) and prints its figures.

    pytest tests/integration/bench/test_bench_peers.py
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(300)


def test_trl_job_on_the_configs_workload_reports_steady_figures(tmp_path):
    from streamrl.models.shapes import build_random_model

    model = build_random_model("qwen3-tiny", tmp_path / "model", "float32")
    out = tmp_path / "out"
    sets = [
        f"model.path={model}",
        "rollout.groups_per_step=2",
        "rollout.group_size=4",
        "generator.max_tokens=8",
        "trainer.micro_batch_size=4",
    ]
    cmd = [sys.executable, "-m", "streamrl.cli", "bench", "peers", "--only", "trl", "--trl-variants", "matched"]
    cmd += ["--no-vllm", "--steps", "3", "--out", str(out)] + [a for s in sets for a in ("--set", s)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads((out / "result.json").read_text())
    assert result["workload"]["completions"] == 8 and result["workload"]["max_tokens"] == 8
    (row,) = result["rows"]
    assert row["job"] == "trl matched" and row["steps"] == 3
    # transformers' generate with min_new_tokens = max_tokens: every step trains 8 completions x 8 tokens
    assert row["trained_tok_s"] > 0 and row["s_per_step"] > 0
    assert row["settings"]["gradient_checkpointing"] is False and row["settings"]["master_weights"] == "bf16"
    assert row["settings"]["gradient_accumulation_steps"] == 2  # 8 completions / micro-batch 4
    assert "trl matched" in proc.stdout
