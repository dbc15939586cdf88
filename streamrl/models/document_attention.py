"""Document-masked attention for packed rows (several documents in one row, position ids restarting at
0 at each document): each token attends causally within its own document only. The RL trainer's
packed rows (trainer.pack_rows, streamrl/train/row_packing.py) and SFT's packed samples
(streamrl/sft/step.py) both use it on the torchtitan backend; hf finds the resets itself.

    enable_document_attention(engine)                       # torchtitan: each layer's SDPA -> DocumentSDPA
    out = model(ids, positions=pos, attention_masks=document_attention_mask(pos))

On GPU a compiled flex_attention BlockMask (only the blocks holding unmasked scores are computed); on
CPU, where flex_attention has no backward, SDPA with the dense block-diagonal causal mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def document_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """Boolean [B, 1, L, L] mask: token q sees token k iff k <= q in the same document (the
    documents of a row are delimited by position resets to 0)."""
    doc = torch.cumsum((position_ids == 0).int(), dim=1)
    same = doc[:, :, None] == doc[:, None, :]
    L = position_ids.shape[1]
    causal = torch.ones((L, L), dtype=torch.bool, device=position_ids.device).tril()
    return (same & causal)[:, None]


_FLEX = None


def _compiled_flex():
    """flex_attention compiled once per process (eager flex materialises the full score matrix)."""
    global _FLEX
    if _FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention

        _FLEX = torch.compile(flex_attention)
    return _FLEX


def document_block_mask(position_ids: Tensor):
    """flex_attention BlockMask of causal attention within each document (documents start at position 0)."""
    from torch.nn.attention.flex_attention import create_block_mask

    doc = torch.cumsum((position_ids == 0).int(), dim=1)

    def same_document_causal(b, h, q, k):
        return (doc[b, q] == doc[b, k]) & (k <= q)

    B, L = position_ids.shape
    return create_block_mask(same_document_causal, B, None, L, L, device=position_ids.device)


class DocumentSDPA(torch.nn.Module):
    """torchtitan inner attention with document masks: a flex_attention BlockMask (GPU), a dense
    boolean [B, 1, L, L] mask through SDPA (CPU: flex has no CPU backward), or None (plain causal)."""

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        attention_masks=None,
        scale: float | None = None,
        enable_gqa: bool = False,
        is_causal: bool = True,
        **_,
    ) -> Tensor:
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        if attention_masks is None:
            out = F.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=is_causal, enable_gqa=enable_gqa)
        elif isinstance(attention_masks, Tensor):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_masks, scale=scale, enable_gqa=enable_gqa)
        else:
            out = _compiled_flex()(q, k, v, block_mask=attention_masks, scale=scale, enable_gqa=enable_gqa)
        return out.transpose(1, 2)


def enable_document_attention(engine) -> None:
    """torchtitan: swap each layer's SDPA (mask-less) for DocumentSDPA; hf needs nothing."""
    if not hasattr(engine, "spec"):  # the torchtitan engine carries its model spec; hf needs nothing
        return
    from torchtitan.models.common.attention import ScaledDotProductAttention

    for module in list(engine.model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, ScaledDotProductAttention):
                setattr(module, name, DocumentSDPA())


def document_attention_mask(position_ids: Tensor):
    """The mask DocumentSDPA takes for these positions: a BlockMask on GPU, the dense mask elsewhere."""
    return document_block_mask(position_ids) if position_ids.device.type == "cuda" else document_mask(position_ids)
