"""LoRA adapters on the hf trainer backend (trainer.lora): peft injects the adapters into the
transformers model, the base stays frozen, and only the adapter is optimized, checkpointed and published.

    peft_model = add_adapters(model, cfg.trainer.lora, model_path)   # before fully_shard; model is changed in place
    names = adapter_names(peft_model, inner_state)                    # inner names -> peft's published names
    config = adapter_config(peft_model)                               # adapter_config.json as a dict
    problem = check_targets(module_shapes, cfg.trainer.lora)          # pre-flight: None or the message
    with adapters_disabled(model): ...                                 # the base model's forward (the reference)

The trainer shards the inner transformers model (the peft wrapper is not a module FSDP needs to
know), so every path that reads its parameters (log-probs, checkpoints) is the full-weight one;
peft's wrapper stays for its state-dict names; `adapters_disabled` gives the base model's forward
(the reference log-probs of reference.source=trainer) without a second copy of the model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from streamrl.config.trainer import LoraConfig

PEFT_PREFIX = "base_model.model."
"""What peft's wrapper puts before the transformers model's own parameter names."""


def peft_lora_config(lora: LoraConfig, model_path: str):
    """The peft LoraConfig of trainer.lora (no bias training: the base stays exactly the base)."""
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=str(model_path),
    )


def add_adapters(model: torch.nn.Module, lora: LoraConfig, model_path: str):
    """Inject trainer.lora's adapters into `model` in place (its base parameters frozen); returns the
    peft wrapper, whose `base_model.model` is `model` itself."""
    from peft import get_peft_model

    if problem := check_targets(linear_shapes(model), lora):
        from streamrl.core.errors import ConfigError

        raise ConfigError(problem)
    peft_model = get_peft_model(model, peft_lora_config(lora, model_path))
    peft_model.peft_config["default"].base_model_name_or_path = str(model_path)
    return peft_model


@contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[None]:
    """Every peft adapter layer of `model` runs its base layer alone inside the block (peft's own
    `disable_adapters` flag, which each LoRA layer's forward and streamrl.models.hf.head_weights read).

    Not peft's `disable_adapter()`: it also sets requires_grad False on entry and True on exit on
    whichever adapter tensors FSDP2 has registered at that moment. Entry marks the sharded ones; a
    no-grad forward leaves the root group (lm_head's adapter) gathered, so exit marks the gathered
    ones and the sharded parameters, which the adapter publish and the checkpoints
    (ignore_frozen_params) select by requires_grad, stay frozen-marked (seen on the tiny model:
    lm_head's lora_A/lora_B left with requires_grad False)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    before = [m._disable_adapters for m in layers]
    for m in layers:
        m._disable_adapters = True
    try:
        yield
    finally:
        for m, was in zip(layers, before):
            m._disable_adapters = was


def linear_shapes(model: torch.nn.Module) -> dict[str, tuple[int, int]]:
    """Qualified name -> (in_features, out_features) of every Linear layer (meta-device models too)."""
    return {
        name: (m.in_features, m.out_features) for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)
    }


def check_targets(shapes: dict[str, tuple[int, int]], lora: LoraConfig) -> str | None:
    """trainer.lora.target_modules against the model's Linear layers (qualified name -> (in, out)):
    each target names at least one layer (its last name part), and the rank fits every targeted
    layer's smaller dimension (a larger rank adds parameters without adding expressiveness and peft
    would train a rank-deficient update). None when they fit, else the message naming the fix."""
    if not lora.enabled:
        return None
    leaves: dict[str, list[tuple[str, tuple[int, int]]]] = {}
    for name, dims in shapes.items():
        leaves.setdefault(name.rsplit(".", 1)[-1], []).append((name, dims))
    unknown = [t for t in lora.target_modules if t not in leaves]
    if unknown:
        known = sorted(leaves)
        return (
            f"trainer.lora.target_modules {unknown} name no Linear layer of the model; its Linear layers are "
            f"{known}: set trainer.lora.target_modules to some of those"
        )
    for target in lora.target_modules:
        name, (din, dout) = min(leaves[target], key=lambda item: min(item[1]))
        if lora.rank > min(din, dout):
            return (
                f"trainer.lora.rank={lora.rank} exceeds {name}'s dimension {min(din, dout)} "
                f"(a {din} -> {dout} Linear); set trainer.lora.rank <= {min(din, dout)} or drop "
                f"{target!r} from trainer.lora.target_modules"
            )
    return None


def adapter_state(peft_model, inner_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter tensors of a state dict of the inner (sharded) model, under the names peft's
    get_peft_model_state_dict gives them (`base_model.model.<name>.lora_A.weight`)."""
    from peft import get_peft_model_state_dict

    prefixed = {PEFT_PREFIX + k: v for k, v in inner_state.items()}
    # save_embedding_layers=False: an adapted lm_head's frozen base weight is the base model's, not the adapter's
    return get_peft_model_state_dict(peft_model, state_dict=prefixed, save_embedding_layers=False)


def adapter_config(peft_model) -> dict:
    """adapter_config.json's content (what peft's save_pretrained writes), JSON-able."""
    raw = peft_model.peft_config["default"].to_dict()
    return json.loads(json.dumps(raw, default=lambda v: sorted(v) if isinstance(v, (set, frozenset)) else str(v)))
