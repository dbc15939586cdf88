"""A LoRA adapter version in the weight store: what publish checks and how its PEFT layout is written.

With trainer.lora the trainer publishes only the adapter: the tensors named as peft's
`get_peft_model_state_dict` names them (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`)
and the PEFT adapter config (LoraConfig.to_dict()). Every backend hands a generator a local folder in
PEFT's layout, `adapter_model.safetensors` + `adapter_config.json`, which vLLM's LoRARequest and
`PeftModel.from_pretrained` both load; the broker hash `weights:latest` carries the config too, so
the backends that move only tensors (cuda_ipc, torchstore) rebuild the folder on the reader's side.

    await publisher.publish(v, adapter_state, adapter=peft_model.peft_config["default"].to_dict())
"""

from __future__ import annotations

import enum
import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from streamrl.core.errors import StreamRLError

ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


class AdapterError(StreamRLError, ValueError):
    """What was published as an adapter is not one (wrong config or tensor names)."""


def _jsonable(value):
    """PEFT's to_dict() holds sets (target_modules) and enums (task_type); JSON wants lists and strings."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(_jsonable(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, enum.Enum):  # PeftType and TaskType are str enums: their value, not their repr
        return value.value
    return value


def adapter_json(state: object, adapter: dict) -> str:
    """The adapter config as JSON after checking that `state` is an adapter's: a dict of tensors with
    LoRA names, published with a LoRA config that names its rank and target modules."""
    config = _jsonable(dict(adapter))
    if str(config.get("peft_type", "")).upper() != "LORA":
        raise AdapterError(
            f"publish(adapter=...) needs a PEFT LoRA config (peft_type 'LORA'), got peft_type="
            f"{config.get('peft_type')!r}; pass peft's LoraConfig.to_dict()"
        )
    missing = [k for k in ("r", "lora_alpha", "target_modules") if config.get(k) in (None, "", [])]
    if missing:
        raise AdapterError(f"the adapter config lacks {missing}; pass peft's LoraConfig.to_dict()")
    if isinstance(state, dict):
        wrong = [k for k in state if "lora_" not in k]
        if not state or wrong:
            raise AdapterError(
                f"an adapter publish holds only LoRA tensors (peft's get_peft_model_state_dict names), "
                f"but got {len(state)} tensors, e.g. {wrong[:3]}; publish without adapter= for full weights"
            )
    return json.dumps(config, sort_keys=True)


def write_peft_dir_tensors(path: Path, state: dict[str, torch.Tensor]) -> None:
    """The adapter's tensors as the safetensors file `path` (PEFT's adapter_model.safetensors)."""
    save_file({k: v.contiguous() for k, v in state.items()}, str(path), metadata={"format": "pt"})


def write_peft_dir(folder: Path, state: dict[str, torch.Tensor], config_json: str, fsync: bool = False) -> int:
    """Write `folder`/adapter_model.safetensors and adapter_config.json; return the tensor file's bytes."""
    weights = folder / ADAPTER_FILE
    write_peft_dir_tensors(weights, state)
    (folder / ADAPTER_CONFIG).write_text(config_json)
    if fsync:  # a shared filesystem: make the bytes durable before the folder's name appears
        for path in (weights, folder / ADAPTER_CONFIG):
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
    return weights.stat().st_size


def is_peft_dir(folder: Path) -> bool:
    return (folder / ADAPTER_FILE).is_file() and (folder / ADAPTER_CONFIG).is_file()
