"""A real LoRA adapter made with peft on the offline tiny model: what the weights and generator tests publish.

model = tiny_peft(base_dir, seed=1)              # PeftModel, random (non-zero) A and B
state, config = adapter_payload(model)           # what the trainer hands publish(..., adapter=config)
"""

from __future__ import annotations

from pathlib import Path

import torch

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def tiny_peft(base: Path, seed: int, rank: int = 4, alpha: float = 8.0, scale: float = 1.0):
    """A PeftModel over the tiny model at `base` whose adapter is random (seeded), so it changes the
    model's outputs (peft's default init has B = 0: the adapter would be a no-op). `scale` multiplies
    the random values: larger adapters move the log-probs more."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=TARGETS)
    peft_model = get_peft_model(model, config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3 * scale)
    return peft_model.eval()


def adapter_payload(peft_model) -> tuple[dict[str, torch.Tensor], dict]:
    """(adapter tensors as full CPU copies under peft's state-dict names, the JSON-able PEFT config)."""
    from peft import get_peft_model_state_dict

    state = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in get_peft_model_state_dict(peft_model).items()}
    config = peft_model.peft_config["default"].to_dict()
    config["base_model_name_or_path"] = str(peft_model.base_model.model.config._name_or_path)
    return state, config
