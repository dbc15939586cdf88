"""Per-token log-probs (and entropy) of target tokens from final hidden states and the LM head,
a chunk of tokens at a time, so the [tokens, vocab] float32 logits never exist at once.

    logp, ent = chunked_logprobs(hidden, head.weight, head.bias, targets, temperature=1.0,
                                 chunk_tokens=2048, with_entropy=True)        # hidden [N, D] -> [N]
    logp, ent = gathered_logprobs(hidden, weight, bias, positions, targets, lengths, ...)  # [B, L, D] -> [B, T]

The forward keeps only one float per token (the log-sum-exp; and the entropy when asked); the backward recomputes each chunk's
logits from the saved hidden states and weight, so activation memory is O(chunk x vocab) instead of
O(tokens x vocab). Logits are computed in the inputs' dtype (bfloat16 on GPU) and softmaxed in
float32, exactly as `log_softmax(linear(h, W).float() / T)` does: the values and gradients equal the
unchunked computation up to summation order. On CUDA each chunk's float32 softmax work is compiled
(trainer.logprob_kernel): eager it is ~10 passes over [chunk, vocab] per step and, in the 0.6B job's
profile, 41% of the trainer step (docs/performance.md). Shared by the trainer backends (streamrl/train/hf_engine.py,
streamrl/train/titan_engine.py) and the reference worker (streamrl/models/hf.py).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F


def _acc(dtype: torch.dtype) -> torch.dtype:
    """Softmax dtype: float32, or float64 for float64 inputs (the exactness tests)."""
    return torch.promote_types(dtype, torch.float32)


def _logits(h: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """One chunk's logits in the inputs' dtype (the GEMM accumulates in float32 either way)."""
    return F.linear(h, weight, bias)


def _chunk_stats(z: Tensor, targets: Tensor, temperature: float, with_entropy: bool):
    """(log-prob of each target, log-sum-exp, entropy or None) of one chunk's logits z [c, V],
    softmaxed in float32. Reads z and writes only per-token values, so compiled it is one or two
    reading passes over the chunk instead of eager's ~6 float32 passes."""
    zf = z.to(_acc(z.dtype)) / temperature
    lse = torch.logsumexp(zf, dim=-1)
    logp = zf.gather(-1, targets[:, None])[:, 0] - lse
    if not with_entropy:
        return logp, lse, None
    p = torch.exp(zf - lse[:, None])
    return logp, lse, lse - (p * zf).sum(-1)


def _chunk_grad(z, lse, ez, targets, g_logp, g_ent, temperature: float, out_dtype: torch.dtype) -> Tensor:
    """d loss / d z (already divided by the temperature, in out_dtype) of one chunk:
    g_logp (onehot(target) - p) - g_ent p (z - E_p[z]), with E_p[z] = ez from the forward. The one-hot
    is a comparison, not a scatter, so compiled it is one pass that reads z and writes the gradient."""
    zf = z.to(_acc(z.dtype)) / temperature
    p = torch.exp(zf - lse[:, None])
    gz = torch.zeros_like(zf)
    if g_logp is not None:
        onehot = torch.arange(zf.shape[-1], device=zf.device)[None, :] == targets[:, None]
        gz = g_logp[:, None] * (onehot.to(zf.dtype) - p)
    if g_ent is not None:
        gz = gz - g_ent[:, None] * p * (zf - ez[:, None])
    return (gz / temperature).to(out_dtype)


_COMPILED: dict[str, object] = {}


def _kernels(compiled: bool):
    """The per-chunk functions, eager or through torch.compile (compiled once per process, lazily:
    importing this module must not start inductor)."""
    if not compiled:
        return _chunk_stats, _chunk_grad
    if not _COMPILED:
        _COMPILED["stats"] = torch.compile(_chunk_stats)
        _COMPILED["grad"] = torch.compile(_chunk_grad)
    return _COMPILED["stats"], _COMPILED["grad"]


def use_compiled_kernel(setting: str, device: torch.device | str) -> bool:
    """trainer.logprob_kernel: "compiled", "eager", or "auto" = compiled on CUDA (inductor's CPU
    code needs a C++ compiler and its compile time outweighs the tiny CPU models' chunks)."""
    return setting == "compiled" or (setting == "auto" and torch.device(device).type == "cuda")


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk, with_entropy, compiled):
        stats, _ = _kernels(compiled)
        n = hidden.shape[0]
        logp = torch.empty(n, dtype=_acc(hidden.dtype), device=hidden.device)
        lse = torch.empty_like(logp)
        ent = torch.empty_like(logp) if with_entropy else logp.new_empty(0)
        for s in range(0, n, chunk):
            lp, lz, e = stats(
                _logits(hidden[s : s + chunk], weight, bias), targets[s : s + chunk], temperature, with_entropy
            )
            logp[s : s + chunk], lse[s : s + chunk] = lp, lz
            if with_entropy:
                ent[s : s + chunk] = e
        ctx.save_for_backward(hidden, weight, bias, targets, lse, ent)
        ctx.temperature, ctx.chunk, ctx.with_entropy, ctx.compiled = temperature, chunk, with_entropy, compiled
        if not with_entropy:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        hidden, weight, bias, targets, lse, ent = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        t, chunk = ctx.temperature, ctx.chunk
        _, grad = _kernels(ctx.compiled)
        use_ent = ctx.with_entropy and g_ent is not None
        ez = lse - ent if use_ent else None  # E_p[z] = lse - entropy
        grad_h = torch.empty_like(hidden) if need_h else None
        # Weight/bias gradients are sums over chunks: accumulated in float32, cast once at the end.
        acc = _acc(weight.dtype)
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=acc, device=bias.device) if need_b else None
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s : s + chunk]
            gz = grad(
                _logits(h, weight, bias),
                lse[s : s + chunk],
                None if ez is None else ez[s : s + chunk],
                targets[s : s + chunk],
                None if g_logp is None else g_logp[s : s + chunk],
                g_ent[s : s + chunk] if use_ent else None,
                t,
                weight.dtype,
            )
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
        return grad_h, grad_w, grad_b, None, None, None, None, None


def chunked_logprobs(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    targets: Tensor,
    temperature: float,
    chunk_tokens: int,
    with_entropy: bool | str = False,
    compiled: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """log softmax(h W^T + b) / T)[target] per row of hidden [N, D] (float32 [N]), and the entropy
    (with_entropy=True: differentiable; "metric": detached; False: None). compiled: each chunk's
    softmax work runs through torch.compile (use_compiled_kernel), same values up to rounding."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    logp, ent = _ChunkedLogprobs.apply(
        hidden, weight, bias, targets, float(temperature), int(chunk_tokens), bool(with_entropy), bool(compiled)
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
    compiled: bool = False,
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
    logp, ent = chunked_logprobs(
        h, weight, bias, targets[rows, cols], temperature, chunk_tokens, with_entropy, compiled
    )
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
