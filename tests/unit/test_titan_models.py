"""The torchtitan backend's pure parts: config.json -> torchtitan spec, rope settings, parallelism config.

pytest tests/unit/test_titan_models.py
"""

from __future__ import annotations

import pytest

from streamrl.config.files import load_config
from streamrl.config.schema import Config, ParallelismConfig, TrainerConfig
from streamrl.core.errors import ConfigError
from streamrl.models.titan import rope_settings, spec_from_hf
from streamrl.train.flops import flops_per_token

LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 256,
    "vocab_size": 100,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
}
QWEN3 = {
    "model_type": "qwen3",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "rope_parameters": {"rope_theta": 1_000_000.0, "rope_type": "default"},
}


def test_rope_theta_from_transformers_5_and_4():
    assert rope_settings(LLAMA) == {"rope_theta": 10000.0, "rope_type": "default"}
    old = {k: v for k, v in LLAMA.items() if k != "rope_parameters"} | {"rope_theta": 500000.0}
    assert rope_settings(old) == {"rope_theta": 500000.0, "rope_type": "default"}
    scaled = old | {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    assert rope_settings(scaled)["rope_type"] == "llama3" and rope_settings(scaled)["factor"] == 8.0


def test_llama_spec_takes_the_checkpoint_shape_sdpa_and_eps():
    from torchtitan.models.common.attention import ScaledDotProductAttention

    spec = spec_from_hf(LLAMA)
    c = spec.config
    assert spec.name == "llama3" and c.dim == 64 and c.vocab_size == 100 and len(c.layers) == 2
    assert not c.enable_weight_tying and c.norm.eps == 1e-5
    attn = c.layers[0].attention
    assert (attn.n_heads, attn.n_kv_heads) == (2, 1) and attn.rope.theta == 10000.0 and attn.rope.scaling == "none"
    assert isinstance(attn.inner_attention, ScaledDotProductAttention.Config)
    assert c.layers[1].feed_forward.w1.out_features == 128 and c.layers[1].attention_norm.eps == 1e-5


def test_llama3_rope_scaling_maps_to_torchtitan():
    hf = LLAMA | {
        "rope_parameters": {
            "rope_theta": 500000.0,
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }
    }
    rope = spec_from_hf(hf).config.layers[0].attention.rope
    assert rope.scaling == "llama" and rope.scaling_factor == 32.0 and rope.original_max_position_embeddings == 8192


def test_qwen3_spec_has_qk_norm_head_dim_and_tied_embeddings():
    spec = spec_from_hf(QWEN3)
    c = spec.config
    attn = c.layers[0].attention
    assert spec.name == "qwen3" and c.enable_weight_tying and len(c.layers) == 28
    assert attn.head_dim == 128 and attn.qk_norm is not None and attn.qk_norm.eps == 1e-6
    assert attn.rope.theta == 1_000_000.0


@pytest.mark.parametrize(
    "change, words",
    [
        ({"model_type": "mistral"}, "model_type='mistral'"),
        ({"attention_bias": True}, "biases"),
        ({"rope_parameters": {"rope_theta": 1e4, "rope_type": "yarn"}}, "rope_type=yarn"),
        ({"head_dim": 48}, "head_dim=48"),
    ],
)
def test_unsupported_checkpoints_name_the_fix(change, words):
    with pytest.raises(ConfigError, match="trainer.backend=hf") as err:
        spec_from_hf(LLAMA | change)
    assert words in str(err.value)


def test_parallelism_degrees_must_make_world_size():
    assert ParallelismConfig().shard_degree(4) == 4
    assert ParallelismConfig(dp_replicate=2, tp=2).shard_degree(8) == 2
    TrainerConfig(world_size=8, backend="torchtitan", parallelism=ParallelismConfig(dp_replicate=2, dp_shard=2, tp=2))
    with pytest.raises(ValueError, match="does not make trainer.world_size=4"):
        TrainerConfig(world_size=4, backend="torchtitan", parallelism=ParallelismConfig(tp=3))
    with pytest.raises(ValueError, match="need trainer.backend=torchtitan"):
        TrainerConfig(world_size=2, parallelism=ParallelismConfig(tp=2))


def test_backend_and_parallelism_from_set_overrides():
    cfg = load_config(None, ["trainer.backend=torchtitan", "trainer.world_size=2", "trainer.parallelism.compile=true"])
    assert cfg.trainer.backend == "torchtitan" and cfg.trainer.parallelism.compile
    assert Config().trainer.backend == "hf"


def test_flops_per_token_of_the_qwen3_1_7b_shape():
    # 28 layers x (attention 2048*128*(32+16) + MLP 3*2048*6144) + lm_head 2048*151936 matmul parameters.
    params = 28 * (2048 * 128 * 48 + 3 * 2048 * 6144) + 2048 * 151936
    assert flops_per_token(QWEN3, 2048) == 6 * params + 12 * 28 * 16 * 128 * 2048
    assert 11e9 < flops_per_token(QWEN3, 2048) < 12e9
