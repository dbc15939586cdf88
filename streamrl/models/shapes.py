"""Qwen3-shaped models with random weights, built offline (no checkpoint needed) for GPU runs and benches.

The tokenizer is streamrl's character tokenizer (so the `charclass` task and reward work unchanged)
padded with filler tokens `<|tN|>` up to the model's vocabulary size, so every id a random model
samples decodes. Weights are drawn straight into the target dtype on the fastest device at hand.

    python -m streamrl.models.shapes qwen3-1.7b runs/models/qwen3-1.7b-random --dtype bfloat16
    path = build_random_model("qwen3-0.6b", out_dir, "bfloat16")
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

from streamrl.core.errors import ConfigError
from streamrl.models.tiny import SPECIAL_TOKENS, vocab

FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "tie_word_embeddings",
)
"""The Qwen3Config fields a shape sets, in the order of the table's columns below."""
# fmt: off
_TABLE = {
    #              hidden  MLP    layers heads kv  head_dim vocab   tied
    # Published Qwen3 configs.
    "qwen3-0.6b": (1024,   3072,  28,    16,   8,  128,     151936, True),
    "qwen3-1.7b": (2048,   6144,  28,    16,   8,  128,     151936, True),
    "qwen3-8b":   (4096,   12288, 36,    32,   8,  128,     151936, False),
    "qwen3-32b":  (5120,   25600, 64,    64,   8,  128,     151936, False),
    # CPU smoke shape (vLLM CPU attention needs head dim >= 32): the bench's CI run.
    "qwen3-tiny": (128,    256,   2,     2,    1,  64,      512,    True),
}
# fmt: on
SHAPES: dict[str, dict] = {name: dict(zip(FIELDS, row, strict=True)) for name, row in _TABLE.items()}
"""shape name -> Qwen3Config fields."""
# The 0.6B body with only the character vocabulary (100 characters + filler to 128): a random policy
# then samples task characters often enough for the charclass reward to give a learning signal
# (with 151,936 ids it almost never does: configs/qwen3-0.6b-learn-gpu.yaml stayed flat).
SHAPES["qwen3-0.6b-chars"] = {**SHAPES["qwen3-0.6b"], "vocab_size": 128}
MARKER = "streamrl_shape.json"
INIT_STD = 0.02


def qwen3_config(shape: str, dtype: str):
    from transformers import Qwen3Config

    if shape not in SHAPES:
        raise ConfigError(f"unknown model shape {shape!r}; choose one of {sorted(SHAPES)}")
    v = vocab()
    return Qwen3Config(
        **SHAPES[shape],
        max_position_embeddings=40960,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        bos_token_id=v[SPECIAL_TOKENS["bos"]],
        eos_token_id=v[SPECIAL_TOKENS["eos"]],
        pad_token_id=v[SPECIAL_TOKENS["pad"]],
        dtype=dtype,
        architectures=["Qwen3ForCausalLM"],  # vLLM picks its model class (and the generate task) by this
    )


def padded_tokenizer(vocab_size: int):
    """The tiny character tokenizer with filler tokens up to `vocab_size` (every id decodes)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    v = dict(vocab())
    if vocab_size < len(v):
        raise ConfigError(f"vocab_size {vocab_size} is smaller than the character vocabulary ({len(v)})")
    for i in range(len(v), vocab_size):
        v[f"<|t{i}|>"] = i
    tok = Tokenizer(models.WordLevel(vocab=v, unk_token=SPECIAL_TOKENS["unk"]))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # one token per character
    tok.decoder = decoders.Fuse()
    bos = SPECIAL_TOKENS["bos"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, v[bos])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=SPECIAL_TOKENS["eos"],
        pad_token=SPECIAL_TOKENS["pad"],
        unk_token=SPECIAL_TOKENS["unk"],
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )


def random_state_dict(config, dtype: str, seed: int, device: str | None = None) -> dict:
    """HF-named random weights (normal(0, 0.02); norms = 1) on `device`, tied lm_head left out."""
    import torch
    from transformers import Qwen3ForCausalLM

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    with torch.device("meta"):
        meta = Qwen3ForCausalLM(config)
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name, p in meta.state_dict().items():
        if config.tie_word_embeddings and name == "lm_head.weight":
            continue  # vLLM and transformers tie it to embed_tokens on load
        if name.endswith("norm.weight"):
            t = torch.ones(p.shape, device=device)
        else:
            t = torch.randn(p.shape, generator=gen, device=device).mul_(INIT_STD)
        out[name] = t.to(getattr(torch, dtype)).cpu()
    return out


def build_random_model(shape: str, out_dir: Path, dtype: str = "bfloat16", seed: int = 0) -> Path:
    """Write a complete HF folder for `shape` to `out_dir` (atomically); reuse an identical build."""
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    out_dir = Path(out_dir)
    want = {"shape": shape, "dtype": dtype, "seed": seed, "fields": SHAPES.get(shape)}
    try:
        if json.loads((out_dir / MARKER).read_text()) == want:
            return out_dir
    except (OSError, ValueError):
        pass
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ConfigError(
            f"{out_dir} holds something other than the {shape} {dtype} seed {seed} build; "
            "delete it or choose another directory"
        )
    config = qwen3_config(shape, dtype)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        config.save_pretrained(tmp)
        save_file(random_state_dict(config, dtype, seed), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        GenerationConfig(
            bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
        ).save_pretrained(tmp)
        padded_tokenizer(config.vocab_size).save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps(want, sort_keys=True))
        tmp.chmod(0o755)
        for f in tmp.iterdir():
            f.chmod(0o644)  # other processes (and users) on the host read the model too
        if out_dir.exists():
            out_dir.rmdir()  # empty (checked above)
        os.rename(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def build_command(model_path: str, dtype: str) -> str | None:
    """The command that builds a missing random-weight shape whose folder the config names (the GPU
    configs' `runs/models/<shape>-random`, as their header says), else None."""
    name = Path(model_path).name
    shape = name.removesuffix("-random")
    if name == shape or shape not in SHAPES:
        return None
    return f"python -m streamrl.models.shapes {shape} {model_path} --dtype {dtype}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m streamrl.models.shapes", description=__doc__.split("\n\n")[0])
    p.add_argument("shape", choices=sorted(SHAPES))
    p.add_argument("out_dir", type=Path)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    print(build_random_model(a.shape, a.out_dir, a.dtype, a.seed))


if __name__ == "__main__":
    main()
