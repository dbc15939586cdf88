"""Training FLOPs of a dense decoder and the GPUs' peaks: MFU in metrics.jsonl (RL trainer, SFT) and the benches.

Convention (torchtitan's): a token of a row of length n costs a + b * n FLOPs (forward + backward),
a = 6 * matmul parameters (lm_head included, also when tied to the embedding), b = 12 * layers *
heads * head_dim (attention, counted without its causal half).

    a, b = flops_coefficients(json.load(open(model_dir / "config.json")))
    mfu = row_flops(a, b, lengths) / train_s / (world_size * peak_flops(device))
"""

from __future__ import annotations

from collections.abc import Iterable

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}
"""Datasheet dense bf16 peaks (TFLOP/s) by device-name fragment (torch.cuda.get_device_name)."""


def flops_coefficients(hf: dict) -> tuple[float, float]:
    """(a, b) of a model's config.json `hf` (see the module docstring)."""
    d, layers, heads = hf["hidden_size"], hf["num_hidden_layers"], hf["num_attention_heads"]
    hd = hf.get("head_dim") or d // heads
    kv = hf.get("num_key_value_heads") or heads
    attn = d * hd * (2 * heads + 2 * kv)  # q, o: heads * hd; k, v: kv * hd
    mlp = 3 * d * hf["intermediate_size"]
    matmul = layers * (attn + mlp) + d * hf["vocab_size"]
    return 6.0 * matmul, 12.0 * layers * heads * hd


def flops_per_token(hf: dict, seq_len: int) -> float:
    """Training FLOPs of one token in a row of `seq_len` tokens."""
    a, b = flops_coefficients(hf)
    return a + b * seq_len


def row_flops(a: float, b: float, lengths: Iterable[int]) -> float:
    """Training FLOPs of rows of these lengths (each token attends within its own row)."""
    return float(sum(a * n + b * n * n for n in lengths))


def peak_flops(device_name: str) -> float | None:
    """Dense bf16 peak FLOP/s of a GPU by its name; None for a device not in PEAK_BF16_TFLOPS (the CPU)."""
    return next((v * 1e12 for k, v in PEAK_BF16_TFLOPS.items() if k in device_name), None)


def model_coefficients(model_dir: str) -> tuple[float, float] | None:
    """flops_coefficients of the model folder's config.json; None where it has none or is not a dense
    decoder this convention covers (no MFU then, never a failure)."""
    import json
    from pathlib import Path

    try:
        return flops_coefficients(json.loads((Path(model_dir) / "config.json").read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
