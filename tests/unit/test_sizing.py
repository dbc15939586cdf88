"""`streamrl plan`'s figures come from the model's config (streamrl/models/sizing.py): parameter counts
of the published Qwen3 shapes, and the layouts of 8 x 80 GB that fit each.

    pytest tests/unit/test_sizing.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from streamrl.commands.plan import shape_of, table
from streamrl.config.files import load_config
from streamrl.core.errors import ConfigError
from streamrl.models.sizing import Plan


@pytest.mark.parametrize("name, billions", [("qwen3-1.7b", 1.72), ("qwen3-8b", 8.19), ("qwen3-32b", 32.76)])
def test_parameter_counts_match_the_published_models(name, billions):
    assert shape_of(name).params / 1e9 == pytest.approx(billions, abs=0.01)


def test_layouts_of_eight_80gb_gpus():
    tokens = 256 * 2048  # configs/qwen3-8b-8gpu.yaml: 256 sequences x 2,048 tokens
    eight = Plan(shape_of("qwen3-8b"), kv_tokens=tokens)
    best = eight.layouts()[0]
    assert (best.trainer_gpus, best.tp, best.generators) == (4, 2, 2)  # the shipped 8-GPU config
    assert eight.min_tp() == 2  # weights + KV cache do not fit one GPU at TP=1 (94 GB)
    assert Plan(shape_of("qwen3-32b"), kv_tokens=tokens).layouts() == []  # 524 GB of trainer state
    assert Plan(shape_of("qwen3-32b"), kv_tokens=tokens, gpus=24).layouts()[0].tp == 4
    kv = shape_of("qwen3-8b").kv_bytes_per_token()
    assert kv == 2 * 36 * 8 * 128 * 2 and shape_of("qwen3-8b").kv_bytes_per_token(tp=16) == kv // 8


def test_plan_prints_the_table_for_the_8gpu_config():
    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "qwen3-8b-8gpu.yaml")
    text = table(cfg, ["qwen3-1.7b", "qwen3-8b", "qwen3-32b"], gpus=8, gpu_gb=80)
    assert "qwen3-8b: trainer on 4 GPU(s) (33 GB each) + 2 generator(s) of TP=2 (47 GB per GPU)" in text
    assert "qwen3-32b: no layout of 8 x 80 GB fits" in text


def test_plan_of_a_gpu_config_whose_random_model_is_not_built_yet(tmp_path):
    # configs/qwen3-8b-8gpu.yaml names runs/models/qwen3-8b-random, built offline on the GPU host: the plan
    # reads the shape it would be built from, here where the folder does not exist
    assert shape_of(str(tmp_path / "qwen3-8b-random")) == shape_of("qwen3-8b")
    with pytest.raises(ConfigError, match="neither a model shape"):
        shape_of(str(tmp_path / "qwen3-9b-random"))
