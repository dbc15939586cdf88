"""Per-token log-probs (and entropy) of target tokens from final hidden states and the LM head,
a chunk of tokens at a time, so the [tokens, vocab] float32 logits never exist at once.

    logp, ent = chunked_logprobs(hidden, head.weight, head.bias, targets, temperature=1.0,
                                 chunk_tokens=2048, with_entropy=True)        # hidden [N, D] -> [N]
    logp, ent = gathered_logprobs(hidden, weight, bias, positions, targets, lengths, ...)  # [B, L, D] -> [B, T]

The forward keeps only one float per token (the log-sum-exp); the backward recomputes each chunk's
logits from the saved hidden states and weight, so activation memory is O(chunk x vocab) instead of
O(tokens x vocab). Logits are computed in the inputs' dtype (bfloat16 on GPU) and softmaxed in
float32, exactly as `log_softmax(linear(h, W).float() / T)` does: the values and gradients equal the
unchunked computation up to summation order. Shared by the trainer backends (workers/train_engine.py,
workers/titan_engine.py) and the reference worker (streamrl/modeling.py).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F


def _acc(dtype: torch.dtype) -> torch.dtype:
    """Softmax dtype: float32, or float64 for float64 inputs (the exactness tests)."""
    return torch.promote_types(dtype, torch.float32)


def _logits(h: Tensor, weight: Tensor, bias: Tensor | None, temperature: float) -> Tensor:
    return F.linear(h, weight, bias).to(_acc(h.dtype)) / temperature


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk, with_entropy):
        n = hidden.shape[0]
        logp = torch.empty(n, dtype=_acc(hidden.dtype), device=hidden.device)
        lse = torch.empty_like(logp)
        ent = torch.empty_like(logp) if with_entropy else logp.new_empty(0)
        for s in range(0, n, chunk):
            z = _logits(hidden[s : s + chunk], weight, bias, temperature)
            lz = torch.logsumexp(z, dim=-1)
            lse[s : s + chunk] = lz
            logp[s : s + chunk] = z.gather(-1, targets[s : s + chunk, None])[:, 0] - lz
            if with_entropy:
                p = torch.exp(z - lz[:, None])
                ent[s : s + chunk] = lz - (p * z).sum(-1)
            del z
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.temperature, ctx.chunk, ctx.with_entropy = temperature, chunk, with_entropy
        if not with_entropy:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        t, chunk = ctx.temperature, ctx.chunk
        use_ent = ctx.with_entropy and g_ent is not None
        grad_h = torch.empty_like(hidden) if need_h else None
        # Weight/bias gradients are sums over chunks: accumulated in float32, cast once at the end.
        acc = _acc(weight.dtype)
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=acc, device=bias.device) if need_b else None
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s : s + chunk]
            z = _logits(h, weight, bias, t)
            p = torch.exp(z - lse[s : s + chunk, None])
            # d logp / dz = onehot(target) - p;  d entropy / dz = -p (z - E_p[z])
            gl = g_logp[s : s + chunk, None] if g_logp is not None else z.new_zeros(z.shape[0], 1)
            gz = p * -gl
            gz.scatter_add_(-1, targets[s : s + chunk, None], gl)
            if use_ent:
                ez = (p * z).sum(-1, keepdim=True)
                gz -= g_ent[s : s + chunk, None] * p * (z - ez)
            del p, z
            gz = (gz / t).to(weight.dtype)
            if need_h:
                grad_h[s : s + chunk] = gz @ weight
            if need_w:
                grad_w += (gz.t() @ h).to(acc)
            if need_b:
                grad_b += gz.to(acc).sum(0)
        if grad_w is not None:
            grad_w = grad_w.to(weight.dtype)
        if grad_b is not None:
            grad_b = grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None


def chunked_logprobs(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    targets: Tensor,
    temperature: float,
    chunk_tokens: int,
    with_entropy: bool | str = False,
) -> tuple[Tensor, Tensor | None]:
    """log softmax(h W^T + b) / T)[target] per row of hidden [N, D] (float32 [N]), and the entropy
    (with_entropy=True: differentiable; "metric": detached; False: None)."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    logp, ent = _ChunkedLogprobs.apply(
        hidden, weight, bias, targets, float(temperature), int(chunk_tokens), bool(with_entropy)
    )
    if not with_entropy:
        return logp, None
    return logp, (ent.detach() if with_entropy == "metric" else ent)


def gathered_logprobs(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    positions: Tensor,
    targets: Tensor,
    lengths: Tensor | None,
    temperature: float,
    chunk_tokens: int,
    with_entropy: bool | str = False,
) -> tuple[Tensor, Tensor | None]:
    """[B, T] log-probs of targets[b, t] predicted at hidden[b, positions[b, t]], for t < lengths[b]
    (None: every t); entries past a row's length are 0 and get no gradient."""
    B, T = positions.shape
    valid = (
        torch.ones((B, T), dtype=torch.bool, device=positions.device)
        if lengths is None
        else (torch.arange(T, device=positions.device)[None, :] < lengths.to(positions.device)[:, None])
    )
    rows, cols = valid.nonzero(as_tuple=True)
    h = hidden[rows, positions[rows, cols]]
    logp, ent = chunked_logprobs(h, weight, bias, targets[rows, cols], temperature, chunk_tokens, with_entropy)
    zeros = logp.new_zeros((B, T))
    return zeros.index_put((rows, cols), logp), (None if ent is None else zeros.index_put((rows, cols), ent))


def token_logprobs(
    logits: Tensor, positions: Tensor, targets: Tensor, temperature: float, with_entropy: bool | str
) -> tuple[Tensor, Tensor | None]:
    """Log-prob of each target under softmax(logits / temperature) at `positions`, and the entropy
    (with_entropy=True: differentiable, for an entropy bonus; "metric": detached, for logging only)."""
    picked = logits.gather(1, positions.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
    logp_all = torch.log_softmax(picked.float() / temperature, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy == "metric":
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
    elif with_entropy:
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy
