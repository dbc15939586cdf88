"""The batch plumbing both trainer engines share (pure, CPU): a batch's right-padded tensors and each
data-parallel rank's micro-batches.

    padded = pad_batch(batch, pad_id, cfg.trainer.seq_multiple())
    plan = plan_micro_batches(batch, dp_size, micro_batch_size, micro_batch_tokens)[dp_rank]
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from streamrl.core.batch import Batch
from streamrl.core.errors import StreamRLError
from streamrl.models.hf import pack_completions


def pad_batch(batch: Batch, pad_id: int, multiple: int = 1) -> dict[str, Tensor]:
    """Right-padded tensors for one (micro-)batch of B rollouts; pure, CPU tensors.

    input_ids, attention_mask [B, L]: prompt + completion, L = longest prompt+completion rounded up
        to a multiple of `multiple` (trainer.seq_bucket); the extra columns are padding.
    positions [B, T]: index of the logit that predicts completion token t, i.e. len(prompt)+t-1;
        T = longest completion; padded entries point at 0 (any valid index; they are masked).
    targets [B, T] (the completion ids), mask [B, T] float (1 on real completion tokens, 0 on an
    episode's observation tokens),
    old_logprobs [B, T] (behaviour log-probs), advantages [B], lengths [B] (completion tokens per
    row), and ref_logprobs [B, T] when the batch carries them. An empty batch gives one fully
    masked row, so a rank with nothing to train on still runs the forward/backward that FSDP's
    collectives need on every rank.
    """
    rows = batch.rollouts
    if not rows:
        one = torch.zeros((1, 1), dtype=torch.long)
        out = {
            "input_ids": one + pad_id,
            "attention_mask": one + 1,
            "positions": one.clone(),
            "targets": one + pad_id,
            "mask": one.float(),
            "old_logprobs": one.float(),
            "advantages": torch.zeros(1),
            "lengths": torch.ones(1, dtype=torch.long),
        }
        if batch.ref_logprobs is not None:
            out["ref_logprobs"] = one.float()
        return out
    for r in rows:
        if len(r.prompt_ids) == 0:
            raise StreamRLError(
                f"rollout {r.rollout_id} has an empty prompt, so its first completion token has no "
                "predicting position; prompts must hold at least one token (e.g. BOS)"
            )
    out = pack_completions([r.prompt_ids for r in rows], [r.completion_ids for r in rows], pad_id)
    extra = -out["input_ids"].shape[1] % multiple
    if extra:  # right padding: under causal attention no real token sees it, and no position points at it
        out["input_ids"] = torch.nn.functional.pad(out["input_ids"], (0, extra), value=pad_id)
        out["attention_mask"] = torch.nn.functional.pad(out["attention_mask"], (0, extra), value=0)
    B, T = out["positions"].shape
    mask = torch.zeros((B, T), dtype=torch.float32)
    old = torch.zeros((B, T), dtype=torch.float32)
    ref = torch.zeros((B, T), dtype=torch.float32) if batch.ref_logprobs is not None else None
    for i, r in enumerate(rows):
        c = len(r.completion_ids)
        weight = 1.0 if batch.loss_mask is None else float(batch.loss_mask[i])
        # Observation tokens of a multi-turn episode (obs_spans) are context, never trained on.
        mask[i, :c] = torch.from_numpy(r.token_mask() * weight) if r.obs_spans else weight
        # torch.tensor copies: decoded arrays are read-only views of the message (from_numpy warns on them)
        old[i, :c] = torch.tensor(np.asarray(r.logprobs, dtype=np.float32))
        if ref is not None:
            ref_row = np.asarray(batch.ref_logprobs[i], dtype=np.float32)
            if len(ref_row) != c:
                raise StreamRLError(
                    f"rollout {r.rollout_id}: {len(ref_row)} reference log-probs for {c} completion "
                    "tokens; the reference worker must annotate every completion token"
                )
            ref[i, :c] = torch.tensor(ref_row)
    out.update(mask=mask, old_logprobs=old, advantages=torch.as_tensor(np.asarray(batch.advantages, dtype=np.float32)))
    if ref is not None:
        out["ref_logprobs"] = ref
    return out


def num_micro_batches(batch_size: int, world: int, micro_batch_size: int) -> int:
    """Micro-batches per rank: the same on every rank (FSDP's collectives must line up)."""
    largest_shard = -(-batch_size // world)
    return max(1, -(-largest_shard // micro_batch_size))


def pack_by_tokens(lengths: list[int], micro_batch_size: int, micro_batch_tokens: int) -> list[list[int]]:
    """Row indices of each micro-batch: rows sorted longest first, a micro-batch closed before its
    padded size (rows x longest row) would pass micro_batch_tokens or its rows micro_batch_size.
    A row longer than the budget trains alone. Sorting keeps rows of similar length together, so
    little of each [rows, longest] input is padding."""
    out: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        # The first row of a micro-batch is its longest (sorted): that length sets its padded size.
        if out and len(out[-1]) < micro_batch_size and lengths[out[-1][0]] * (len(out[-1]) + 1) <= micro_batch_tokens:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def plan_micro_batches(
    batch: Batch, world: int, micro_batch_size: int, micro_batch_tokens: int
) -> list[list[list[int]]]:
    """For each data-parallel rank, the row indices (into its batch.shard) of each micro-batch; every
    rank gets the same number (FSDP's collectives must line up), padded with empty micro-batches.

    micro_batch_tokens = 0: contiguous slices of at most micro_batch_size rows (num_micro_batches)."""
    shards = [batch.shard(r, world) for r in range(world)]
    if not micro_batch_tokens:
        k = num_micro_batches(len(batch), world, micro_batch_size)
        return [[list(range(i * len(s) // k, (i + 1) * len(s) // k)) for i in range(k)] for s in shards]
    plans = [
        pack_by_tokens(
            [len(r.prompt_ids) + len(r.completion_ids) for r in s.rollouts], micro_batch_size, micro_batch_tokens
        )
        for s in shards
    ]
    k = max(1, max(len(p) for p in plans))
    return [p + [[] for _ in range(k - len(p))] for p in plans]
