"""Hugging Face config.json -> a torchtitan model spec (Llama 3, Qwen 3), for the torchtitan trainer backend.

    spec = titan_spec("/path/to/hf_model")   # TitanSpec(name, config, adapter, parallelize)
    with torch.device("meta"):
        model = spec.config.build()

torchtitan's registry holds fixed flavors (llama3 "8B", qwen3 "1.7B", ...); a checkpoint's own shape
(the tiny test model, a fine-tuned variant) is built with the same per-layer builders the registry
uses, from the numbers in config.json. Attention is SDPA with a causal mask: streamrl's batches are
one right-padded sequence per row, so causal attention never lets a real token see padding, and
SDPA is the one torchtitan attention with a CPU backward (flex has none). Q/K/V stay three
projections (fuse_qkv=False): torchtitan's fused wqkv renames its parameters through state-dict
hooks that torch.distributed.checkpoint's get_state_dict (streamrl/train/checkpoint.py) cannot follow.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from streamrl.core.errors import ConfigError


def _torch_compat() -> None:
    """Let torchtitan 0.3.0 import on torch < 2.12.

    torchtitan imports torch.distributed.fsdp.DataParallelMeshDims (new in torch 2.12) at module
    level but uses it only on its full_dtensor/spmd_types paths; this backend runs partial_dtensor,
    so on an older torch a stand-in that is never instantiated lets the import succeed.
    """
    import torch.distributed.fsdp as fsdp

    if not hasattr(fsdp, "DataParallelMeshDims"):

        class DataParallelMeshDims:  # noqa: D101 - placeholder, see above
            def __init__(self, *args, **kwargs):
                raise RuntimeError("torch >= 2.12 is needed for torchtitan's full_dtensor path")

        fsdp.DataParallelMeshDims = DataParallelMeshDims


_torch_compat()

SUPPORTED = ("llama", "qwen3")
"""config.json model_type values the torchtitan backend builds; others use trainer.backend=hf."""


@dataclass
class TitanSpec:
    name: str
    config: Any
    """torchtitan Decoder.Config (Llama3Model.Config or Qwen3Model.Config)."""
    adapter: Callable[..., Any]
    """State-dict adapter class: adapter(config, None).from_hf / .to_hf convert the names."""
    parallelize: Callable[..., Any]
    """torchtitan's parallelize function for the architecture (parallelize_llama / parallelize_qwen3)."""


def read_hf_config(model_path: str | Path) -> dict:
    path = Path(model_path) / "config.json"
    if not path.is_file():
        raise ConfigError(f"{path} not found; model.path must be a Hugging Face model folder")
    return json.loads(path.read_text())


def rope_settings(hf: dict) -> dict:
    """{theta, type, and scaling numbers} from transformers 5's `rope_parameters` or 4.x's top-level keys."""
    params = dict(hf.get("rope_parameters") or {})
    if "rope_theta" not in params:
        # transformers 4.x: rope_theta at the top level, scaling under rope_scaling.
        params.update(hf.get("rope_scaling") or {})
        params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    return params


def head_dim(hf: dict) -> int:
    return int(hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"])


def _check_plain(hf: dict) -> None:
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise ConfigError(
            f"{hf['model_type']} with attention/mlp biases is not built by the torchtitan "
            "backend; set trainer.backend=hf"
        )
    if hf.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"hidden_act={hf['hidden_act']} is not SwiGLU; set trainer.backend=hf")


def _set_eps(config: Any, eps: float) -> None:
    config.norm.eps = eps
    for layer in config.layers:
        layer.attention_norm.eps = layer.ffn_norm.eps = eps
        if layer.attention.qk_norm is not None:
            layer.attention.qk_norm.eps = eps


def _sdpa(config: Any) -> None:
    from torchtitan.models.common.attention import ScaledDotProductAttention

    for layer in config.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()


def _decoder(model_cls: Any, hf: dict, layers: list) -> Any:
    """The decoder config around `layers`: embeddings, final norm, LM head (tied if the checkpoint is)."""
    from torchtitan.models.common import Embedding, Linear, RMSNorm

    dim, vocab = hf["hidden_size"], hf["vocab_size"]
    return model_cls.Config(
        dim=dim,
        vocab_size=vocab,
        layers=layers,
        enable_weight_tying=bool(hf.get("tie_word_embeddings")),
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim),
        norm=RMSNorm.Config(normalized_shape=dim),
        lm_head=Linear.Config(in_features=dim, out_features=vocab),
    )


def _llama(hf: dict) -> TitanSpec:
    from torchtitan.models.common import ComplexRoPE
    from torchtitan.models.llama3 import Llama3Model, Llama3StateDictAdapter, _build_llama3_layers, parallelize_llama

    dim, n_heads = hf["hidden_size"], hf["num_attention_heads"]
    if head_dim(hf) != dim // n_heads:
        raise ConfigError(
            f"llama head_dim={head_dim(hf)} differs from hidden_size/num_attention_heads; "
            "torchtitan's Llama 3 does not build it, set trainer.backend=hf"
        )
    rope = rope_settings(hf)
    rope_kw: dict[str, Any] = {"scaling": "none"}
    if rope["rope_type"] == "llama3":
        rope_kw = {
            "scaling": "llama",
            "scaling_factor": rope["factor"],
            "low_freq_factor": rope["low_freq_factor"],
            "high_freq_factor": rope["high_freq_factor"],
            "original_max_position_embeddings": rope["original_max_position_embeddings"],
        }
    elif rope["rope_type"] != "default":
        raise ConfigError(
            f"llama rope_type={rope['rope_type']} is not built by the torchtitan backend "
            "(default and llama3 are); set trainer.backend=hf"
        )
    # The registry's own layer builder; attn_backend "flex" only names a placeholder swapped for SDPA.
    layers = _build_llama3_layers(
        n_layers=hf["num_hidden_layers"],
        dim=dim,
        n_heads=n_heads,
        n_kv_heads=hf.get("num_key_value_heads"),
        hidden_dim=hf["intermediate_size"],
        attn_backend="flex",
        fuse_qkv=False,
        rope=ComplexRoPE.Config(
            dim=dim // n_heads, max_seq_len=hf["max_position_embeddings"], theta=float(rope["rope_theta"]), **rope_kw
        ),
    )
    return TitanSpec("llama3", _decoder(Llama3Model, hf, layers), Llama3StateDictAdapter, parallelize_llama)


def _qwen3(hf: dict) -> TitanSpec:
    from torchtitan.models.common import CosSinRoPE
    from torchtitan.models.qwen3 import Qwen3Model, Qwen3StateDictAdapter, _build_qwen3_layers, parallelize_qwen3

    rope = rope_settings(hf)
    if rope["rope_type"] != "default":
        raise ConfigError(
            f"qwen3 rope_type={rope['rope_type']} is not built by the torchtitan backend; set trainer.backend=hf"
        )
    dim, hd = hf["hidden_size"], head_dim(hf)
    layers = _build_qwen3_layers(
        n_layers=hf["num_hidden_layers"],
        dim=dim,
        n_heads=hf["num_attention_heads"],
        n_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        head_dim=hd,
        hidden_dim=hf["intermediate_size"],
        attn_backend="flex",
        fuse_qkv=False,
        rope=CosSinRoPE.Config(dim=hd, max_seq_len=hf["max_position_embeddings"], theta=float(rope["rope_theta"])),
    )
    return TitanSpec("qwen3", _decoder(Qwen3Model, hf, layers), Qwen3StateDictAdapter, parallelize_qwen3)


def spec_from_hf(hf: dict) -> TitanSpec:
    """The torchtitan model spec for a parsed config.json (SDPA attention, the checkpoint's norm eps)."""
    kind = hf.get("model_type")
    if kind not in SUPPORTED:
        raise ConfigError(
            f"model_type={kind!r} has no torchtitan definition here (supported: "
            f"{', '.join(SUPPORTED)}); set trainer.backend=hf"
        )
    _check_plain(hf)
    spec = _llama(hf) if kind == "llama" else _qwen3(hf)
    _set_eps(spec.config, float(hf.get("rms_norm_eps", 1e-6)))
    _sdpa(spec.config)
    return spec


def titan_spec(model_path: str | Path) -> TitanSpec:
    return spec_from_hf(read_hf_config(model_path))
