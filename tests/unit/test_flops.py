"""Training FLOPs of a dense decoder (streamrl/train/flops.py): the MFU of metrics.jsonl, SFT and the benches.

pytest tests/unit/test_flops.py -q
"""

from __future__ import annotations

import json

import pytest

from streamrl.train.flops import flops_coefficients, model_coefficients, peak_flops, row_flops

QWEN3_06B = {
    "hidden_size": 1024,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 3072,
    "vocab_size": 151936,
}


def test_coefficients_count_every_matmul_and_the_attention_per_token():
    a, b = flops_coefficients(QWEN3_06B)
    attn = 1024 * 128 * (2 * 16 + 2 * 8)
    mlp = 3 * 1024 * 3072
    assert a == 6 * (28 * (attn + mlp) + 1024 * 151936)
    assert b == 12 * 28 * 16 * 128
    # ~0.6e9 matmul parameters with lm_head (0.44e9 in the layers): 3.6 GFLOPs a token before attention
    assert 3.5e9 < a < 3.7e9


def test_rows_cost_a_per_token_plus_attention_within_the_row():
    a, b = 10.0, 1.0
    assert row_flops(a, b, [3, 5]) == (10 * 3 + 9) + (10 * 5 + 25)
    assert row_flops(a, b, []) == 0.0


def test_peaks_by_gpu_name_and_none_for_the_cpu():
    assert peak_flops("NVIDIA H200") == pytest.approx(989e12)
    assert peak_flops("NVIDIA A100-SXM4-80GB") == pytest.approx(312e12)
    assert peak_flops("") is None and peak_flops("cpu") is None


def test_model_folder_without_a_dense_config_has_no_coefficients(tmp_path):
    assert model_coefficients(str(tmp_path)) is None  # no config.json
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    assert model_coefficients(str(tmp_path)) is None  # not a decoder this convention covers
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_06B))
    assert model_coefficients(str(tmp_path)) == flops_coefficients(QWEN3_06B)
