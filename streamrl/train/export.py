"""Export a run's checkpoint as a Hugging Face model folder that transformers and vLLM load directly.

    streamrl export RUN_DIR [--step N] --out DIR
    export_checkpoint(run_dir, out_dir, step=None)   # newest checkpoint when step is None

Works for RL (`streamrl up`) and SFT (`streamrl sft`) runs alike: it reads the run's
RUN_DIR/config.yaml (base model folder, trainer backend, dtype) and the model part of a
torch.distributed.checkpoint directory (streamrl/train/checkpoint.py) in this one process, with no
process group, so any world size of the run exports the same way. torchtitan-named weights are
converted to Hugging Face names with the architecture's state-dict adapter. The folder gets the
base model's config (dtype = model.dtype), the weights as safetensors (sharded past 5 GB), the
tokenizer (with its chat template) and the generation config; it is written to a temporary
folder and renamed, so a half-written export never looks complete. Both `up` and `sft` call
this at the end of a run to write RUN_DIR/hf.

With trainer.lora the checkpoint holds only the adapter: it is applied to the base (model.path) and
the folder gets the merged model (what transformers and vLLM load as a plain model) and, under
DIR/adapter, the adapter in PEFT layout (adapter_model.safetensors + adapter_config.json), which
peft's PeftModel.from_pretrained and vLLM's LoRARequest load on top of the base model. It is a
sub-folder: an adapter_config.json beside config.json would make transformers apply it again.
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from pathlib import Path

import torch

from streamrl.config.files import load_config
from streamrl.core.errors import ConfigError
from streamrl.train.checkpoint import list_checkpoints

MAX_SHARD = "5GB"
ADAPTER_DIR = "adapter"
"""Sub-folder of a LoRA run's export holding the adapter in PEFT layout."""


def checkpoint_model_state(path: Path) -> dict[str, torch.Tensor]:
    """The `model` entries of a DCP checkpoint, as full CPU tensors under the trainer's own names."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    model = {
        key[len("model.") :]: torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in metadata.items()
        if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)
    }
    if not model:
        raise ConfigError(
            f"{path} holds no model weights; pass a checkpoint directory written by streamrl "
            "(RUN_DIR/checkpoints/step-N)"
        )
    state = {"model": model}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(path), no_dist=True)
    return state["model"]


def to_hf_names(state: dict[str, torch.Tensor], backend: str, model_path: str) -> dict[str, torch.Tensor]:
    """Hugging Face names: the hf backend's already are; torchtitan's go through its adapter."""
    if backend == "hf":
        return state
    # Composition-root import (this runs only in the `export` command): the adapter lives with the
    # torchtitan backend.
    from streamrl.models.titan import titan_spec
    from streamrl.train.titan_engine import clean_name

    spec = titan_spec(model_path)
    return spec.adapter(spec.config, None).to_hf({clean_name(k): v for k, v in state.items()})


def import_savers() -> None:
    """Import what save_hf_folder uses (seconds: transformers' auto classes), e.g. ahead of the export."""
    from huggingface_hub import split_torch_state_dict_into_shards  # noqa: F401
    from safetensors.torch import save_file  # noqa: F401
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig  # noqa: F401


def save_hf_folder(state: dict[str, torch.Tensor], model_path: str, dtype: str, out: Path) -> None:
    """config + safetensors + tokenizer + generation config into `out` (must not exist yet)."""
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    config = AutoConfig.from_pretrained(model_path)
    config.dtype = dtype
    if getattr(config, "tie_word_embeddings", False):
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}  # loaders re-tie it
    state = {k: v.to(getattr(torch, dtype)).contiguous() for k, v in state.items()}
    out.mkdir(parents=True)
    config.save_pretrained(out)
    split = split_torch_state_dict_into_shards(state, max_shard_size=MAX_SHARD)
    for filename, names in split.filename_to_tensors.items():
        save_file({n: state[n] for n in names}, out / filename, metadata={"format": "pt"})
    if split.is_sharded:
        import json

        index = {
            "metadata": {"total_size": sum(v.numel() * v.element_size() for v in state.values())},
            "weight_map": split.tensor_to_filename,
        }
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    try:
        GenerationConfig.from_pretrained(model_path).save_pretrained(out)
    except OSError:  # the base folder has none: derive the token ids from the model config
        GenerationConfig.from_model_config(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(model_path).save_pretrained(out)


def merge_adapter(adapter: dict[str, torch.Tensor], cfg, out: Path) -> dict[str, torch.Tensor]:
    """Apply a LoRA checkpoint's adapter (the trainer's own names) to the base model: write the adapter
    in PEFT layout to `out`, return the merged model's HF state dict."""
    from transformers import AutoModelForCausalLM

    from streamrl.train.lora import add_adapters

    base = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=torch.float32)
    peft_model = add_adapters(base, cfg.trainer.lora, cfg.model.path)
    keys = base.load_state_dict(adapter, strict=False)  # `base` now holds the adapter layers in place
    missing = [k for k in keys.missing_keys if "lora_" in k]
    if keys.unexpected_keys or missing:
        raise ConfigError(
            f"the checkpoint's adapter does not fit trainer.lora of the run's config.yaml (unexpected "
            f"{keys.unexpected_keys[:3]}, missing {missing[:3]}); export with the config the run trained with"
        )
    peft_model.save_pretrained(out, save_embedding_layers=False)  # an adapted lm_head's base is the base model's
    return {k: v.detach() for k, v in peft_model.merge_and_unload().state_dict().items()}


def current_umask() -> int:
    """This process's umask, read without setting it (os.umask would change it for every thread for a moment;
    the export runs in a thread of `streamrl up`)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def readable_files(folder: Path) -> None:
    """Every file under `folder` with the mode a plain write gives (0644 under umask 022): safetensors
    writes its files 0600 (a private temporary file renamed), the other files of the export are 0644."""
    umask = current_umask()
    for path in folder.rglob("*"):
        if path.is_file():
            path.chmod(0o666 & ~umask)


def export_checkpoint(run_dir: Path, out_dir: Path, step: int | None = None) -> Path:
    """Write checkpoint `step` (default: the newest) of `run_dir` as a HF folder at `out_dir`."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{run_dir} has no config.yaml; pass the run directory of a `streamrl up` or `streamrl sft`")
    found = list_checkpoints(run_dir)
    if not found:
        raise ConfigError(
            f"{run_dir / 'checkpoints'} holds no complete checkpoint; train at least "
            "trainer.checkpoint_every steps (or stop the run gracefully) first"
        )
    if step is not None and step not in found:
        raise ConfigError(f"no checkpoint of step {step} in {run_dir / 'checkpoints'}; there are steps {sorted(found)}")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / "config.json").is_file():
        raise ConfigError(
            f"--out {out_dir} holds something other than a model folder; choose an empty or new directory"
        )
    cfg = load_config(run_dir / "config.yaml")
    if not cfg.model.path:
        raise ConfigError(
            f"{run_dir / 'config.yaml'} names no model.path, so the base model's config and tokenizer cannot be found"
        )
    state = to_hf_names(
        checkpoint_model_state(found[step if step is not None else max(found)]), cfg.trainer.backend, cfg.model.path
    )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        if cfg.trainer.lora.enabled:
            state = merge_adapter(state, cfg, tmp / ADAPTER_DIR)
        save_hf_folder(state, cfg.model.path, cfg.model.dtype, tmp / "hf")
        if cfg.trainer.lora.enabled:
            (tmp / ADAPTER_DIR).rename(tmp / "hf" / ADAPTER_DIR)
        readable_files(tmp / "hf")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        (tmp / "hf").rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
