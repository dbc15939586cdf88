"""Staging buffers of the trainer's async checkpoints: one CPU tensor per tensor of the
model + optimizer state dict (pinned on CUDA), allocated once and reused by every save.

    buffers = staging_buffers(state)           # same structure as `state`; no device copies
    stager.state_dict_cache = buffers          # BlockingAsyncStager copies into them from then on

torch's own `_create_cpu_state_dict` (what BlockingAsyncStager calls at the first save) also
copies every DTensor to the host once (`obj.to("cpu")`) and pins through a second host copy;
with the 0.6B model + AdamW state that was 6 s on the training thread (docs/performance.md,
"Memory, chunked log-probs ..."). Here only empty buffers are allocated, and the Checkpointer
does it on a helper thread after the first optimizer step (when the optimizer state exists), so
the first save only copies, as every later one does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor


def _buffer(t: torch.Tensor, pin: bool) -> torch.Tensor:
    if t.dim() == 0:  # as torch's stager: scalars (AdamW's step) are plain CPU scalars
        return torch.zeros((), dtype=t.dtype)
    return torch.empty(tuple(t.shape), dtype=t.dtype, pin_memory=pin and t.numel() > 0)


def staging_buffers(state: Any, pin: bool | None = None) -> Any:
    """Empty CPU tensors shaped as every tensor in `state` (nested dicts/lists as DCP state dicts
    are); other leaves are kept as they are. A DTensor's buffer is a DTensor with the same
    sharding spec around a CPU local tensor (what `DTensor.to("cpu")` gives, without the copy).
    `pin` defaults to whether CUDA is available (pinning needs it)."""
    pin = torch.cuda.is_available() if pin is None else pin
    if isinstance(state, DTensor):
        if state.dim() == 0:
            return state
        return DTensor(_buffer(state._local_tensor, pin), state._spec, requires_grad=False)
    if isinstance(state, torch.Tensor):
        return _buffer(state, pin)
    if isinstance(state, dict):
        return {k: staging_buffers(v, pin) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(staging_buffers(v, pin) for v in state)
    return state


def staging_bytes(buffers: Any) -> int:
    """Bytes held by the buffers (this rank's local shards)."""
    if isinstance(buffers, DTensor):
        return buffers._local_tensor.numel() * buffers._local_tensor.element_size()
    if isinstance(buffers, torch.Tensor):
        return buffers.numel() * buffers.element_size()
    if isinstance(buffers, dict):
        return sum(staging_bytes(v) for v in buffers.values())
    if isinstance(buffers, (list, tuple)):
        return sum(staging_bytes(v) for v in buffers)
    return 0
