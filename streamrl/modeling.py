"""Model helpers shared by the roles that run a Hugging Face model (reference, trainer).

    model = load_hf_model(path, dtype="float32", device="cpu")
    lps = completion_logprobs(model, prompts, completions, temperature=1.0)  # list of float32 arrays
"""

from __future__ import annotations

import numpy as np
import torch


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


@torch.no_grad()
def completion_logprobs(model, prompts: list, completions: list, temperature: float = 1.0,
                        pad_id: int = 0) -> list[np.ndarray]:
    """Log-prob of each completion token under `model` (logits / temperature), one array per row."""
    device = next(model.parameters()).device
    ids, attn = pack_sequences(prompts, completions, pad_id)
    logits = model(input_ids=ids.to(device), attention_mask=attn.to(device)).logits.float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    out = []
    for i, (p, c) in enumerate(zip(prompts, completions)):
        start, n = len(p) - 1, len(c)
        targets = ids[i, len(p): len(p) + n].to(device)
        out.append(logp[i, start: start + n].gather(-1, targets[:, None])[:, 0].cpu().numpy().astype(np.float32))
    return out
