"""streamrl.models.logprobs: chunked log-probs and entropy equal the full-logits computation (values and
gradients, float64), and never form a [tokens, vocab] tensor in the forward or the backward.

    pytest tests/unit/test_chunked_logprobs.py
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from streamrl.models.logprobs import chunked_logprobs, gathered_logprobs, token_logprobs, use_compiled_kernel

N, D, V, T = 37, 6, 50, 0.7


def inputs(bias: bool, seed: int = 0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, D, generator=g, dtype=dtype, requires_grad=True)
    w = torch.randn(V, D, generator=g, dtype=dtype, requires_grad=True)
    b = torch.randn(V, generator=g, dtype=dtype, requires_grad=True) if bias else None
    targets = torch.randint(0, V, (N,), generator=g)
    return h, w, b, targets


def full(h, w, b, targets, with_entropy):
    logp_all = torch.log_softmax(torch.nn.functional.linear(h, w, b) / T, -1)
    logp = logp_all.gather(-1, targets[:, None])[:, 0]
    return logp, (-(logp_all.exp() * logp_all).sum(-1) if with_entropy else None)


def objective(logp, ent, seed: int = 1):
    """A loss that weighs every token differently, so a wrong per-token gradient shows."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(logp.shape, generator=g, dtype=logp.dtype)
    out = (a * logp).sum() + (logp**2).sum()
    return out if ent is None else out + (torch.randn(ent.shape, generator=g, dtype=ent.dtype) * ent).sum()


@pytest.mark.parametrize("chunk", [1, 5, N, 1000])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_values_and_gradients_equal_the_full_logits(chunk, bias, with_entropy):
    h, w, b, targets = inputs(bias)
    params = [h, w] + ([b] if bias else [])
    want = full(h, w, b, targets, with_entropy)
    got = chunked_logprobs(h, w, b, targets, T, chunk, with_entropy)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-12)
    if with_entropy:
        torch.testing.assert_close(got[1], want[1], rtol=0, atol=1e-12)
    else:
        assert got[1] is None
    g_want = torch.autograd.grad(objective(*want), params)
    g_got = torch.autograd.grad(objective(*got), params)
    for a, e in zip(g_got, g_want, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=1e-10)


def test_metric_entropy_is_detached_and_gradient_free():
    h, w, b, targets = inputs(False)
    logp, ent = chunked_logprobs(h, w, None, targets, T, 4, "metric")
    assert not ent.requires_grad and logp.requires_grad
    torch.testing.assert_close(ent, full(h, w, None, targets, True)[1].detach(), rtol=0, atol=1e-12)


def test_gathered_matches_token_logprobs_on_a_padded_batch():
    """[B, L, D] hidden states with right-padded completions: the same values and gradients as the
    trainer's full-logits path (token_logprobs), zeros past each row's length."""
    g = torch.Generator().manual_seed(3)
    B, L, Tc = 3, 9, 5
    hidden = torch.randn(B, L, D, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(V, D, generator=g, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([5, 2, 0])
    positions = torch.zeros(B, Tc, dtype=torch.long)
    for i, (start, n) in enumerate([(3, 5), (1, 2), (0, 0)]):
        positions[i, :n] = torch.arange(start, start + n)
    targets = torch.randint(0, V, (B, Tc), generator=g)
    valid = (torch.arange(Tc)[None] < lengths[:, None]).double()
    # token_logprobs' indexing in float64 (token_logprobs itself softmaxes in float32)
    logp_all = torch.log_softmax((hidden @ w.t())[torch.arange(B)[:, None], positions] / T, -1)
    lp_full = logp_all.gather(-1, targets[..., None])[..., 0]
    ent_full = -(logp_all.exp() * logp_all).sum(-1)
    lp32, _ = token_logprobs((hidden @ w.t()).float(), positions, targets, T, with_entropy=False)
    torch.testing.assert_close(lp32.double(), lp_full, rtol=0, atol=1e-5)
    lp, ent = gathered_logprobs(hidden, w, None, positions, targets, lengths, T, 3, with_entropy=True)
    torch.testing.assert_close(lp, lp_full * valid, rtol=0, atol=1e-12)
    torch.testing.assert_close(ent, ent_full * valid, rtol=0, atol=1e-12)
    assert lp[1, 2:].eq(0).all() and lp[2].eq(0).all()
    want = torch.autograd.grad(objective(lp_full * valid, ent_full * valid), [hidden, w])
    got = torch.autograd.grad(objective(lp, ent), [hidden, w])
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=1e-10)


def test_lower_precision_inputs_give_float32_logprobs():
    h, w, _, targets = inputs(False, dtype=torch.bfloat16)
    logp, _ = chunked_logprobs(h, w, None, targets, 1.0, 8)
    assert logp.dtype == torch.float32
    ref = torch.log_softmax(torch.nn.functional.linear(h, w).float(), -1).gather(-1, targets[:, None])[:, 0]
    torch.testing.assert_close(logp, ref, rtol=0, atol=1e-5)
    logp.sum().backward()
    assert h.grad.dtype == w.grad.dtype == torch.bfloat16


class LargestTensor(TorchDispatchMode):
    """Records the element count of the largest tensor any aten op returns (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def _largest(fn) -> tuple[int, int]:
    """(largest tensor in the forward, largest in the backward) of objective(fn(h, w))."""
    g = torch.Generator().manual_seed(0)
    n, d, v = 256, 8, 1000
    h = torch.randn(n, d, generator=g, requires_grad=True)
    w = torch.randn(v, d, generator=g, requires_grad=True)
    targets = torch.randint(0, v, (n,), generator=g)
    with LargestTensor() as fwd:
        loss = objective(*fn(h, w, targets))
    with LargestTensor() as bwd:
        loss.backward()
    return fwd.largest, bwd.largest


def test_no_tokens_by_vocab_tensor_in_forward_or_backward():
    n, d, v, chunk = 256, 8, 1000, 16
    # The probe sees the full-logits path's [N, V] tensors in both passes ...
    fwd, bwd = _largest(lambda h, w, t: full(h, w, None, t, True))
    assert fwd >= n * v and bwd >= n * v
    # ... and none in the chunked path: the largest is one chunk's logits or the [V, D] weight gradient.
    fwd, bwd = _largest(lambda h, w, t: chunked_logprobs(h, w, None, t, T, chunk, True))
    assert fwd <= max(chunk * v, v * d) and bwd <= max(chunk * v, v * d), (fwd, bwd)


def test_compiled_kernel_equals_eager():
    """trainer.logprob_kernel=compiled (torch.compile'd per-chunk softmax work, here inductor's CPU
    code) gives the eager path's values and gradients: with and without a differentiable entropy,
    a bias, and a short last chunk (a second chunk shape, so compile's dynamic-shape graph runs too)."""
    for with_entropy in (True, False):
        h, w, b, targets = inputs(True)
        params = [h, w, b]
        want = chunked_logprobs(h, w, b, targets, T, 8, with_entropy)
        got = chunked_logprobs(h, w, b, targets, T, 8, with_entropy, compiled=True)
        for a, e in zip(got, want, strict=True):
            torch.testing.assert_close(a, e, rtol=0, atol=1e-12)
        g_want = torch.autograd.grad(objective(*want), params)
        g_got = torch.autograd.grad(objective(*got), params)
        for a, e in zip(g_got, g_want, strict=True):
            torch.testing.assert_close(a, e, rtol=0, atol=1e-10)


def test_logprob_kernel_setting():
    assert use_compiled_kernel("auto", "cuda") and not use_compiled_kernel("auto", "cpu")
    assert use_compiled_kernel("compiled", "cpu") and not use_compiled_kernel("eager", "cuda:0")
