"""The offline tiny model: a randomly-initialised Llama + character tokenizer, built from a seed.

No downloads: `build_tiny_model` writes a complete Hugging Face folder (config.json,
model.safetensors, tokenizer files, generation_config.json) that transformers, vLLM (CPU
build) and torchtitan's Llama3 adapter all load. Same (config, seed) -> byte-identical files.

    python -m streamrl.models.tiny /tmp/tiny          # build with the default config, seed 0
    path = resolve_model_path(cfg.model, run_dir / "models", cfg.run.seed)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import string
import sys
import tempfile
import threading
from pathlib import Path

from streamrl.config.schema import Config, ModelConfig, TinyModelConfig
from streamrl.core.cache import cache_dir as streamrl_cache
from streamrl.core.errors import ConfigError
from streamrl.models.tiny_chat import CHAT_TOKENS, IM_END, QWEN3_STYLE_TEMPLATE

BUILD_VERSION = 1
"""Bump when the build recipe changes so cached folders are not mistaken for new builds."""
MARKER = "streamrl_tiny.json"
_INIT_LOCK = threading.Lock()
SPECIAL_TOKENS = {"pad": "<pad>", "bos": "<s>", "eos": "</s>", "unk": "<unk>"}
# Every character the tasks use: letters, digits, space, ASCII punctuation, newline.
CHARS = string.ascii_letters + string.digits + " " + string.punctuation + "\n"


def vocab(chat: bool = False) -> dict[str, int]:
    """Token -> id: the four special tokens first (pad=0, bos=1, eos=2, unk=3), then CHARS, then
    (chat variant) <|im_start|>, <|im_end|>."""
    tokens = list(SPECIAL_TOKENS.values()) + list(CHARS) + (CHAT_TOKENS if chat else [])
    return {tok: i for i, tok in enumerate(tokens)}


def fingerprint(cfg: TinyModelConfig, seed: int) -> str:
    """Stable hash of everything that determines the built bytes."""
    # chat_template=false is left out so the plain build keeps the hash it had before the field existed.
    dumped = cfg.model_dump(mode="json", exclude=None if cfg.chat_template else {"chat_template"})
    blob = json.dumps(
        {"cfg": dumped, "seed": seed, "build": BUILD_VERSION, "chars": CHARS},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def build_tokenizer(chat: bool = False):
    """A character-level PreTrainedTokenizerFast that prepends <s> and decodes by concatenation.
    `chat`: Qwen's shape instead: no <s>, eos <|im_end|>, a Qwen3-style chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    v = vocab(chat)
    tok = Tokenizer(models.WordLevel(vocab=v, unk_token=SPECIAL_TOKENS["unk"]))
    # Split on the empty pattern isolates every character (space and newline included).
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    bos = SPECIAL_TOKENS["bos"]
    if chat:  # matched whole before the character split, like Qwen's added tokens
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CHAT_TOKENS])
    else:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, v[bos])]
        )
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=IM_END if chat else SPECIAL_TOKENS["eos"],
        pad_token=SPECIAL_TOKENS["pad"],
        unk_token=SPECIAL_TOKENS["unk"],
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )
    if chat:
        out.chat_template = QWEN3_STYLE_TEMPLATE
    return out


def _llama_config(cfg: TinyModelConfig):
    from transformers import LlamaConfig

    v = vocab(cfg.chat_template)
    return LlamaConfig(
        vocab_size=len(v),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        initializer_range=cfg.init_std,
        # Untied so torchtitan's Llama3 adapter maps lm_head and embed_tokens one to one.
        tie_word_embeddings=False,
        bos_token_id=v[SPECIAL_TOKENS["bos"]],
        eos_token_id=v[IM_END if cfg.chat_template else SPECIAL_TOKENS["eos"]],
        pad_token_id=v[SPECIAL_TOKENS["pad"]],
        dtype="float32",
    )


def tiny_hf_config(cfg: TinyModelConfig):
    """The transformers config the tiny build writes (shapes known without building it)."""
    return _llama_config(cfg)


def _write_build(cfg: TinyModelConfig, seed: int, dest: Path, fp: str) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import GenerationConfig, LlamaForCausalLM

    config = _llama_config(cfg)
    # Weight init draws from torch's global RNG: fork it so callers' RNG state is untouched, and
    # hold a lock so two threads building at once cannot interleave their draws.
    with _INIT_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float32)
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    config.save_pretrained(dest)
    save_file(state, dest / "model.safetensors", metadata={"format": "pt"})
    # Only token ids: sampling settings come from streamrl's config, never from the model folder.
    GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    ).save_pretrained(dest)
    build_tokenizer(cfg.chat_template).save_pretrained(dest)
    marker = {"fingerprint": fp, "seed": seed, "build": BUILD_VERSION, "tiny": cfg.model_dump(mode="json")}
    (dest / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")


def _marker_fingerprint(path: Path) -> str | None:
    try:
        return json.loads((path / MARKER).read_text()).get("fingerprint")
    except (OSError, ValueError):
        return None


def build_tiny_model(cfg: TinyModelConfig, out_dir: Path, seed: int) -> Path:
    """Write the tiny model folder to `out_dir` (atomically) unless the same build is already there."""
    out_dir = Path(out_dir)
    fp = fingerprint(cfg, seed)
    if _marker_fingerprint(out_dir) == fp:
        return out_dir
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ConfigError(
            f"{out_dir} already holds something other than the tiny model build {fp} "
            "(different config/seed, or not a tiny build); delete it or choose another directory"
        )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        _write_build(cfg, seed, tmp, fp)
        # mkdtemp makes a 0700 dir; other users/processes on the host read the model too.
        tmp.chmod(0o755)
        for f in tmp.iterdir():
            f.chmod(0o644)
        try:
            os.rename(tmp, out_dir)  # atomic; fails if another process finished first
        except OSError:
            if _marker_fingerprint(out_dir) != fp:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def is_hub_id(path: str) -> bool:
    """`path` names a Hugging Face hub model ("Qwen/Qwen3-1.7B"), not a folder here."""
    return not Path(path).expanduser().exists() and bool(_HUB_ID.fullmatch(path))


def resolve_model_path(model_cfg: ModelConfig, cache_dir: Path, seed: int) -> Path:
    """`model.path` if set (checked), else the tiny build under `cache_dir` (built on first use)."""
    if model_cfg.path:
        path = Path(model_cfg.path).expanduser()
        if is_hub_id(model_cfg.path):
            # A hub id ("Qwen/Qwen3-1.7B"): transformers and vLLM resolve it from the local Hugging Face
            # cache (or download it where the machine may); streamrl itself never downloads.
            return Path(model_cfg.path)
        if not path.is_dir():
            raise ConfigError(
                f"model.path={model_cfg.path!r} is not a directory; point it at a local Hugging Face "
                "model folder, or unset model.path to use the offline tiny model"
            )
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"model.path={model_cfg.path!r} has no config.json, so it is not a Hugging Face model "
                "folder; point it at the folder that holds config.json and the weights"
            )
        return path
    fp = fingerprint(model_cfg.tiny, seed)
    return build_tiny_model(model_cfg.tiny, Path(cache_dir) / f"tiny-{fp}", seed)


def resolve_model(cfg: Config) -> Config:
    """`cfg` with model.path set: the path it names, or the tiny offline model built into the cache
    (streamrl.core.cache) when it is unset. What `streamrl up`, `streamrl worker` and the benches run."""
    path = resolve_model_path(cfg.model, streamrl_cache() / "models", cfg.run.seed)
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": str(path)})})


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-model")
    print(build_tiny_model(TinyModelConfig(), target, seed=0))
