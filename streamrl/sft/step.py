"""The SFT step on the trainer's engines (workers/trainer_engines.make_engine): cross-entropy over the loss
tokens of a batch, the same model, optimizer, lr schedule and gradient clipping as RL.

    engine = make_engine(cfg, model_path, rank, world); enable_document_attention(engine)
    metrics = sft_train_step(engine, my_samples)       # collective; identical metrics on every rank
    loss = sft_eval_loss(engine, my_eval_samples)

Loss = sum of -log p(target) over every rank's loss tokens / the batch's loss-token count (a token
mean over the whole batch, so packing, micro-batching and the number of ranks do not change it).
FSDP averages gradients over data-parallel ranks, so each rank's sum is scaled by dp_size.

Attention for packed rows (several documents in one row, position ids restarting at 0):
- hf: position_ids go to the model without an attention mask (and without a KV cache); transformers
  finds the resets and builds a block-diagonal causal mask for its attention implementation (the
  default sdpa: a dense [L, L] mask, CPU and GPU; flash-attention-2, where installed and chosen,
  turns the resets into varlen boundaries instead).
- torchtitan: RoPE takes the per-token positions; each layer's inner attention becomes
  `DocumentSDPA` (streamrl/models/document_attention.py): on GPU compiled flex_attention with a document BlockMask (only the blocks that
  hold unmasked scores are computed); on CPU, where flex_attention has no backward, SDPA with the
  dense block-diagonal causal mask.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from streamrl.models.document_attention import document_attention_mask
from streamrl.sft.data import Sample
from streamrl.sft.pack import collate, plan_micro_batches


def _is_titan(engine) -> bool:
    return hasattr(engine, "spec")


def logits_of(engine, t: dict[str, Tensor], packed: bool) -> Tensor:
    """[B, L, V] logits of one micro-batch on the engine's model."""
    if _is_titan(engine):
        from torch.distributed.tensor import DTensor

        if packed:
            pos = t["position_ids"]
            out = engine.model(t["input_ids"], positions=pos, attention_masks=document_attention_mask(pos))
        else:  # right-padded rows under causal attention: real tokens never see padding
            out = engine.model(t["input_ids"])
        return out.full_tensor() if isinstance(out, DTensor) else out
    if packed:
        return engine.model(input_ids=t["input_ids"], position_ids=t["position_ids"], use_cache=False).logits
    return engine.model(input_ids=t["input_ids"], attention_mask=t["attention_mask"], use_cache=False).logits


def _nll_sum(engine, t: dict[str, Tensor], packed: bool) -> Tensor:
    logits = logits_of(engine, t, packed)
    keep = t["mask"] > 0
    # Only the loss positions go through log-softmax: [n, V] instead of [B, L, V] in float32.
    return F.cross_entropy(logits[keep].float(), t["targets"][keep], reduction="sum")


def _micro_batches(engine, samples: list[Sample]) -> list[list[Sample]]:
    """This rank's micro-batches, padded with empty ones to the largest count over the ranks."""
    sft = engine.cfg.sft
    groups = plan_micro_batches(samples, sft.micro_batch_tokens, sft.packing)
    n = torch.tensor([len(groups)], dtype=torch.int64, device=engine.device)
    dist.all_reduce(n, op=dist.ReduceOp.MAX)
    return groups + [[] for _ in range(int(n.item()) - len(groups))]


def _sum_all(engine, values: list[float], op=dist.ReduceOp.SUM) -> list[float]:
    buf = torch.tensor(values, dtype=torch.float64, device=engine.device)
    dist.all_reduce(buf, op=op)
    return buf.tolist()


def sft_train_step(engine, samples: list[Sample]) -> dict[str, float]:
    """One optimizer step on this rank's samples (every rank calls it with its own share)."""
    start = time.perf_counter()
    sft = engine.cfg.sft
    local_tokens = float(sum(s.loss_tokens for s in samples))
    total_tokens, seq_tokens, attn_sq = _sum_all(
        engine, [local_tokens, float(sum(len(s.ids) for s in samples)), float(sum(len(s.ids) ** 2 for s in samples))]
    )
    if total_tokens == 0:  # every rank sees the summed count, so every rank raises
        from streamrl.sft.trainable import no_loss_tokens

        raise no_loss_tokens(len(samples))
    engine.optimizer.zero_grad(set_to_none=True)
    nll, padded_tokens = 0.0, 0
    scale = engine.dp_size / max(1.0, total_tokens)
    for group in _micro_batches(engine, samples):
        t = collate(group, sft.packing, engine.pad_id)
        padded_tokens += 0 if not group else t["input_ids"].numel()
        t = {k: (v.to(engine.device) if isinstance(v, Tensor) else v) for k, v in t.items()}
        loss_sum = _nll_sum(engine, t, sft.packing)
        (loss_sum * scale).backward()
        nll += float(loss_sum.detach())
    grad_norm = torch.nn.utils.clip_grad_norm_(engine.model.parameters(), engine.cfg.trainer.grad_clip)
    grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
    lr = float(engine.optimizer.param_groups[0]["lr"])  # the rate this step used (before the schedule moves)
    skipped = not torch.isfinite(torch.tensor(grad_norm)).item()
    if skipped:  # a non-finite norm would turn every weight into NaN: skip the step, report it
        engine.optimizer.zero_grad(set_to_none=True)
    else:
        engine.optimizer.step()
        engine.steps_done += 1
    engine.scheduler.step()
    nll_all, padded_all = _sum_all(engine, [nll, float(padded_tokens)])
    (step_s,) = _sum_all(engine, [time.perf_counter() - start], op=dist.ReduceOp.MAX)
    return {
        "loss": nll_all / max(1.0, total_tokens),
        "loss_tokens": total_tokens,
        "seq_tokens": seq_tokens,
        "attn_sq_tokens": attn_sq,
        "padding_frac": 1.0 - seq_tokens / max(1.0, padded_all),
        "grad_norm": grad_norm,
        "lr": lr,
        "skipped_step": float(skipped),
        "train_s": step_s,
    }


@torch.no_grad()
def sft_eval_loss(engine, samples: list[Sample]) -> float:
    """Token-mean loss over every rank's held-out samples (collective, no gradient)."""
    packed = engine.cfg.sft.packing
    nll = 0.0
    for group in _micro_batches(engine, samples):
        t = collate(group, packed, engine.pad_id)
        t = {k: (v.to(engine.device) if isinstance(v, Tensor) else v) for k, v in t.items()}
        nll += float(_nll_sum(engine, t, packed))
    total_nll, tokens = _sum_all(engine, [nll, float(sum(s.loss_tokens for s in samples))])
    return total_nll / max(1.0, tokens)
