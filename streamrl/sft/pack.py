"""SFT micro-batches: samples packed into rows without padding (or right-padded rows), as tensors.

    groups = plan_micro_batches(samples, budget=cfg.sft.micro_batch_tokens, packing=True)
    t = collate(groups[0], packing=True, pad_id=0)     # input_ids, position_ids, targets, mask [B, L]

Packed: one row per micro-batch, the samples' tokens back to back; `position_ids` restart at 0 at
every document, which is what marks the document boundaries for attention (transformers builds a
block-diagonal causal mask from the resets; the torchtitan backend builds one from them too).
Token j's target is token j+1 of the same document; a document's last token has no target.
Padded: one sample per row, right-padded, with an attention mask. Pure; CPU tensors.
"""

from __future__ import annotations

import numpy as np
import torch

from streamrl.sft.data import Sample


def plan_micro_batches(samples: list[Sample], budget: int, packing: bool) -> list[list[Sample]]:
    """Consecutive groups of samples, each within `budget` tokens (packed: total length; padded:
    rows x longest row). In order, so every rank and every rerun forms the same groups."""
    groups: list[list[Sample]] = []
    current: list[Sample] = []
    longest = 0
    for s in samples:
        n = len(s.ids)
        cost = (sum(len(x.ids) for x in current) + n) if packing else (len(current) + 1) * max(longest, n)
        if current and cost > budget:
            groups.append(current)
            current, longest = [], 0
        current.append(s)
        longest = max(longest, n)
    if current:
        groups.append(current)
    return groups


def _targets(s: Sample) -> tuple[np.ndarray, np.ndarray]:
    """(target id, mask) per input position: position j predicts token j+1."""
    tgt = np.zeros(len(s.ids), dtype=np.int64)
    m = np.zeros(len(s.ids), dtype=np.float32)
    tgt[:-1], m[:-1] = s.ids[1:], s.mask[1:]
    return tgt, m


def collate(samples: list[Sample], packing: bool, pad_id: int) -> dict[str, torch.Tensor]:
    """Tensors of one micro-batch; an empty list gives one fully masked 1-token row (a rank with no
    data still runs the forward/backward that FSDP's collectives need)."""
    if not samples:
        one = torch.zeros((1, 1), dtype=torch.long)
        return {
            "input_ids": one + pad_id,
            "position_ids": one.clone(),
            "targets": one.clone(),
            "mask": one.float(),
            "attention_mask": one + 1,
            "doc_lens": [1],
        }
    if packing:
        ids = np.concatenate([s.ids for s in samples])
        pos = np.concatenate([np.arange(len(s.ids)) for s in samples])
        parts = [_targets(s) for s in samples]
        tgt, m = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        return {
            "input_ids": torch.from_numpy(ids)[None],
            "position_ids": torch.from_numpy(pos)[None],
            "targets": torch.from_numpy(tgt)[None],
            "mask": torch.from_numpy(m)[None],
            "doc_lens": [len(s.ids) for s in samples],
        }
    L = max(len(s.ids) for s in samples)
    B = len(samples)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    tgt = torch.zeros((B, L), dtype=torch.long)
    m = torch.zeros((B, L), dtype=torch.float32)
    attn = torch.zeros((B, L), dtype=torch.long)
    for i, s in enumerate(samples):
        n = len(s.ids)
        t, mm = _targets(s)
        ids[i, :n], tgt[i, :n], m[i, :n], attn[i, :n] = (
            torch.from_numpy(s.ids),
            torch.from_numpy(t),
            torch.from_numpy(mm),
            1,
        )
    pos = torch.arange(L).expand(B, L).clone()
    return {
        "input_ids": ids,
        "position_ids": pos,
        "targets": tgt,
        "mask": m,
        "attention_mask": attn,
        "doc_lens": [len(s.ids) for s in samples],
    }
