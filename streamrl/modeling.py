"""Model helpers shared by the roles that run a Hugging Face model (reference, trainer).

    model = load_hf_model(path, dtype="float32", device="cpu")
    lps = completion_logprobs(model, prompts, completions, temperature=1.0)  # list of float32 arrays
    hidden = decoder_hidden_states(model, input_ids, attention_mask)     # [B, L, D], LM head skipped
"""

from __future__ import annotations

import inspect

import numpy as np
import torch
from torch import Tensor

from streamrl.errors import ConfigError
from streamrl.logprobs import gathered_logprobs

LOGIT_TRANSFORMS = ("final_logit_softcapping", "logits_soft_cap", "logits_scaling", "logit_scale",
                    "lm_head_multiplier", "unpadded_vocab_size")
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


def pack_sequences(prompts: list, completions: list, pad_id: int = 0):
    """Right-padded [B, L] input ids, attention mask, and for each row the slice of positions whose
    logits predict the completion tokens (position len(prompt)+t-1 predicts completion token t)."""
    lengths = [len(p) + len(c) for p, c in zip(prompts, completions)]
    L = max(lengths)
    ids = torch.full((len(prompts), L), pad_id, dtype=torch.long)
    attn = torch.zeros((len(prompts), L), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        seq = torch.as_tensor(np.concatenate([np.asarray(p), np.asarray(c)]).astype(np.int64))
        ids[i, : len(seq)] = seq
        attn[i, : len(seq)] = 1
    return ids, attn


def check_plain_head(model) -> torch.nn.Module:
    """The model's LM head, checked to be the last op before the logits (a Linear); else ConfigError."""
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise ConfigError(f"{type(model).__name__}'s output embedding is {type(head).__name__}, not a Linear; "
                          "chunked log-probs need a plain LM head: set trainer.logprob_chunk_tokens=0")
    for key in LOGIT_TRANSFORMS:
        value = getattr(model.config, key, None)
        if value not in (None, 1, 1.0):
            raise ConfigError(f"{type(model).__name__} transforms its logits after the LM head ({key}={value}), "
                              "which chunked log-probs do not reproduce: set trainer.logprob_chunk_tokens=0")
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


@torch.no_grad()
def completion_logprobs(model, prompts: list, completions: list, temperature: float = 1.0,
                        pad_id: int = 0, chunk_tokens: int = 2048) -> list[np.ndarray]:
    """Log-prob of each completion token under `model` (logits / temperature), one array per row;
    the logits are formed chunk_tokens tokens at a time (streamrl.logprobs)."""
    device = next(model.parameters()).device
    head = check_plain_head(model)
    ids, attn = pack_sequences(prompts, completions, pad_id)
    B, T = len(prompts), max(1, max(len(c) for c in completions))
    positions = torch.zeros((B, T), dtype=torch.long)
    targets = torch.zeros((B, T), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        positions[i, : len(c)] = torch.arange(len(p) - 1, len(p) + len(c) - 1)
        targets[i, : len(c)] = ids[i, len(p): len(p) + len(c)]
    lengths = torch.as_tensor([len(c) for c in completions])
    hidden = decoder_hidden_states(model, ids.to(device), attn.to(device))
    logp, _ = gathered_logprobs(hidden, head.weight, head.bias, positions.to(device), targets.to(device),
                                lengths.to(device), temperature, chunk_tokens)
    return [logp[i, : len(c)].cpu().numpy().astype(np.float32) for i, c in enumerate(completions)]
