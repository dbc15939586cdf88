"""Rollout rows packed into fewer, fuller rows for the RL trainer's forward (trainer.pack_rows).

    packed = pack_rows(padded["attention_mask"], padded["input_ids"], budget=1024, pad_id=0, multiple=16)
    out = model(packed["packed_ids"], positions=packed["packed_positions"], attention_masks=mask)
    padded_out = out.reshape(-1, out.shape[-1])[packed["unpack_index"]]    # back to [B, L, ...]

A micro-batch of B right-padded rows [B, L] becomes R rows of at most `budget` tokens (a longer
rollout gets a row of its own), the rollouts back to back, positions restarting at 0 at each one:
position resets mark the documents for attention (streamrl/models/document_attention.DocumentSDPA: a document
BlockMask on GPU, a dense block-diagonal causal mask on CPU), so no token attends across rollouts.
`unpack_index` [B, L] maps each padded position to its packed one, so the model's per-token output
goes back to the padded layout and the log-prob and loss code runs unchanged. Positions after a
rollout's end (padding in [B, L]) map to the rollout's first token: the loss never reads them.
Packed padding tokens get position 0 each, i.e. a one-token document of their own. Pure; CPU tensors.
"""

from __future__ import annotations

import torch
from torch import Tensor


def plan_rows(lengths: list[int], budget: int) -> list[list[int]]:
    """Row indices of each packed row: first fit, longest rollouts first (in index order among equals),
    each packed row within `budget` tokens unless one rollout alone is longer."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        n = lengths[i]
        for b, free in enumerate(room):
            if n <= free:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(budget - n)
    return bins


def pack_rows(attention_mask: Tensor, input_ids: Tensor, budget: int, pad_id: int, multiple: int = 1) -> dict:
    """packed_ids, packed_positions [R, Lp] (Lp = the fullest row rounded up to `multiple`) and
    unpack_index [B, L] (into the flattened [R * Lp]) for right-padded input_ids [B, L]."""
    B, L = input_ids.shape
    lengths = [max(1, n) for n in attention_mask.sum(1).tolist()]  # an empty row still gets one slot
    bins = plan_rows(lengths, budget)
    width = max(sum(lengths[i] for i in b) for b in bins)
    width += -width % multiple
    ids = torch.full((len(bins), width), pad_id, dtype=input_ids.dtype)
    pos = torch.zeros((len(bins), width), dtype=torch.long)
    unpack = torch.zeros((B, L), dtype=torch.long)
    for r, rows in enumerate(bins):
        offset = 0
        for i in rows:
            n = lengths[i]
            ids[r, offset : offset + n] = input_ids[i, :n]
            pos[r, offset : offset + n] = torch.arange(n)
            start = r * width + offset
            unpack[i, :n] = torch.arange(start, start + n)
            unpack[i, n:] = start
            offset += n
    return {"packed_ids": ids, "packed_positions": pos, "unpack_index": unpack}
