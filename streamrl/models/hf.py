"""Model helpers shared by the roles that run a Hugging Face model (reference, trainer).

    model = load_hf_model(path, dtype="float32", device="cpu")
    lps = completion_logprobs(model, prompts, completions, temperature=1.0)  # list of float32 arrays
    logp, ent = causal_lm_logprobs(model, pack_completions(prompts, completions), 1.0, chunk_tokens=2048)
    hidden = decoder_hidden_states(model, input_ids, attention_mask)     # [B, L, D], LM head skipped

`causal_lm_logprobs` is the one log-prob function of both sides of the KL term: the reference
worker's (frozen model, through completion_logprobs) and the hf trainer backend's (FSDP2, graph kept).
"""

from __future__ import annotations

import inspect

import numpy as np
import torch
from torch import Tensor

from streamrl.core.errors import ConfigError
from streamrl.models.logprobs import gathered_logprobs, token_logprobs, use_compiled_kernel

LOGIT_TRANSFORMS = (
    "final_logit_softcapping",
    "logits_soft_cap",
    "logits_scaling",
    "logit_scale",
    "lm_head_multiplier",
    "unpadded_vocab_size",
)
"""config.json fields with which a transformers model changes its logits after the LM head (Gemma's
soft-capping, Cohere's/Granite's scales, ...): the chunked log-probs would not see the change."""


def pick_device(choice: str = "auto") -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(choice)


def load_hf_model(path: str, dtype: str = "float32", device: str | torch.device = "cpu"):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    return model.to(device)


def pack_completions(prompts: list, completions: list, pad_id: int = 0) -> dict[str, Tensor]:
    """Right-padded CPU tensors of B prompt+completion rows, what causal_lm_logprobs reads.

    input_ids, attention_mask [B, L], L = longest prompt+completion; positions [B, T]: the index of
    the logit that predicts completion token t, len(prompt)+t-1 (0 on padding: any valid index);
    targets [B, T]: the completion ids (pad_id on padding); lengths [B]: completion tokens per row;
    T = longest completion (at least 1)."""
    B = len(prompts)
    L = max(len(p) + len(c) for p, c in zip(prompts, completions))
    T = max(1, max(len(c) for c in completions))
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((B, L), dtype=torch.long)
    positions = torch.zeros((B, T), dtype=torch.long)
    targets = torch.full((B, T), pad_id, dtype=torch.long)
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        p, c = len(prompt), len(completion)
        seq = np.concatenate([np.asarray(prompt), np.asarray(completion)]).astype(np.int64)
        input_ids[i, : p + c] = torch.from_numpy(seq)
        attention_mask[i, : p + c] = 1
        positions[i, :c] = torch.arange(p - 1, p + c - 1)
        targets[i, :c] = torch.from_numpy(seq[p:])
    lengths = torch.as_tensor([len(c) for c in completions], dtype=torch.long)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "positions": positions,
        "targets": targets,
        "lengths": lengths,
    }


def check_plain_head(model) -> torch.nn.Module:
    """The model's LM head, checked to be the last op before the logits (a Linear, or a Linear with a
    peft LoRA adapter: see head_weights); else ConfigError."""
    head = model.get_output_embeddings()
    if hasattr(head, "lora_A") and any(not isinstance(d, torch.nn.Identity) for d in head.lora_dropout.values()):
        raise ConfigError(
            "trainer.lora.dropout > 0 on lm_head is not reproduced by chunked log-probs (they form the head's "
            "weight once); set trainer.lora.dropout=0, drop lm_head from trainer.lora.target_modules, or set "
            "trainer.logprob_chunk_tokens=0"
        )
    if not isinstance(getattr(head, "base_layer", head), torch.nn.Linear):
        raise ConfigError(
            f"{type(model).__name__}'s output embedding is {type(head).__name__}, not a Linear; "
            "chunked log-probs need a plain LM head: set trainer.logprob_chunk_tokens=0"
        )
    for key in LOGIT_TRANSFORMS:
        value = getattr(model.config, key, None)
        if value not in (None, 1, 1.0):
            raise ConfigError(
                f"{type(model).__name__} transforms its logits after the LM head ({key}={value}), "
                "which chunked log-probs do not reproduce: set trainer.logprob_chunk_tokens=0"
            )
    return head


def decoder_hidden_states(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Final (normed) hidden states [B, L, D] of a transformers causal LM, through the model's own
    forward (so FSDP's hooks run) with the LM head applied to the last position only."""
    captured = []
    handle = model.get_decoder().register_forward_hook(lambda _m, _a, out: captured.append(out[0]))
    kwargs = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    try:
        model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs)
    finally:
        handle.remove()
    return captured[-1]


def unsharded_weight(owner: torch.nn.Module, module: torch.nn.Module, name: str = "weight") -> Tensor:
    """module.<name> as the full tensor FSDP2 gathered for this forward, so its gradient reaches FSDP's
    reduce-scatter; a tensor-parallel shard is then all-gathered, differentiably.

    `owner` is the FSDP module whose parameter group holds the weight: unshard() is a no-op right
    after its forward (FSDP keeps the root's and the last group's parameters gathered for the
    backward) and gathers them if a reshard policy freed them. Read the attribute only after it:
    FSDP swaps the registered parameter between the sharded and the gathered one."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    if isinstance(owner, FSDPModule):
        owner.unshard()
    weight = getattr(module, name)
    return weight.full_tensor() if isinstance(weight, DTensor) else weight


def head_weights(owner: torch.nn.Module, head: torch.nn.Module) -> tuple[Tensor, Tensor | None]:
    """The LM head's (weight, bias) as unsharded_weight gathers them. A head with a peft LoRA adapter
    (trainer.lora.target_modules with lm_head) gives W + scale * B @ A of its active adapters,
    differentiably, or W alone with the adapter disabled (streamrl.train.lora.adapters_disabled): the weight its forward applies."""
    base = getattr(head, "base_layer", head)
    weight = unsharded_weight(owner, base)
    bias = None if base.bias is None else unsharded_weight(owner, base, "bias")
    if base is head or head.disable_adapters or head.merged:
        return weight, bias
    for name in head.active_adapters:
        if name in head.lora_A:
            a, b = unsharded_weight(owner, head.lora_A[name]), unsharded_weight(owner, head.lora_B[name])
            weight = weight + head.scaling[name] * (b @ a).to(weight.dtype)
    return weight, bias


def causal_lm_logprobs(
    model,
    inputs: dict[str, Tensor],
    temperature: float,
    chunk_tokens: int,
    with_entropy: bool | str = False,
    kernel: str = "auto",
) -> tuple[Tensor, Tensor | None]:
    """[B, T] log-probs of inputs["targets"] under softmax(logits / temperature) of a transformers
    causal LM (inputs as pack_completions makes them, on the model's device), and the entropy
    (with_entropy=True: differentiable; "metric": detached; False: None). Gradients flow unless
    the caller disables them.

    chunk_tokens > 0: the logits are formed that many tokens at a time from the decoder's hidden
    states (streamrl.models.logprobs), never all at once; 0: the model's full logits. Under FSDP2 the LM
    head's weight is the gathered one (unsharded_weight), so its gradient reaches FSDP. kernel:
    trainer.logprob_kernel (streamrl.models.logprobs.use_compiled_kernel)."""
    if not chunk_tokens:
        logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], use_cache=False).logits
        return token_logprobs(logits, inputs["positions"], inputs["targets"], temperature, with_entropy)
    head = check_plain_head(model)
    hidden = decoder_hidden_states(model, inputs["input_ids"], inputs["attention_mask"])
    weight, bias = head_weights(model, head)
    return gathered_logprobs(
        hidden,
        weight,
        bias,
        inputs["positions"],
        inputs["targets"],
        inputs["lengths"],
        temperature,
        chunk_tokens,
        with_entropy,
        use_compiled_kernel(kernel, hidden.device),
    )


@torch.no_grad()
def completion_logprobs(
    model,
    prompts: list,
    completions: list,
    temperature: float = 1.0,
    pad_id: int = 0,
    chunk_tokens: int = 2048,
    kernel: str = "auto",
) -> list[np.ndarray]:
    """Log-prob of each completion token under `model` (logits / temperature), one array per row,
    by causal_lm_logprobs: the trainer's function (give it the trainer's chunk_tokens)."""
    device = next(model.parameters()).device
    inputs = {k: v.to(device) for k, v in pack_completions(prompts, completions, pad_id).items()}
    logp, _ = causal_lm_logprobs(model, inputs, temperature, chunk_tokens, kernel=kernel)
    return [logp[i, : len(c)].cpu().numpy().astype(np.float32) for i, c in enumerate(completions)]
