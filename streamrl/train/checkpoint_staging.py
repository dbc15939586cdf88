"""Staging buffers of the trainer's async checkpoints: one CPU tensor per tensor of the
model + optimizer state dict (pinned on CUDA), allocated once and reused by every save.

    pool = BufferPool.for_training(model, optimizer)   # at start-up (a helper thread): the allocation
    buffers = pool.staging_buffers(state)              # after the first step: the state's structure
    stager.state_dict_cache = buffers                  # BlockingAsyncStager copies into them from then on

torch's own `_create_cpu_state_dict` (what BlockingAsyncStager calls at the first save) also
copies every DTensor to the host once (`obj.to("cpu")`) and pins through a second host copy; with
the 0.6B model + AdamW state that was 6 s on the training thread at the first save. Allocating
the same pinned buffers on a helper thread after the first step still cost the training thread
~4.8 s over the next two steps on the H200 (pinned allocation contends with the training thread's
CUDA calls), so the Checkpointer allocates them before training starts, while the trainer waits for
the generators' first batch anyway (docs/performance.md, "Real jobs on one H200"). The optimizer
state does not exist then (AdamW creates it at its first step), so the pool holds one buffer per
model tensor plus `slots` per parameter (AdamW: exp_avg, exp_avg_sq), matched by shape and dtype
when the state's structure is known.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch.distributed.tensor import DTensor

Key = tuple[tuple[int, ...], torch.dtype]


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


def optimizer_slots(optimizer: torch.optim.Optimizer) -> int:
    """Parameter-shaped state tensors the optimizer keeps per parameter (0 where unknown)."""
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return 3 if any(g.get("amsgrad") for g in optimizer.param_groups) else 2
    return 0


class BufferPool:
    """Empty CPU tensors by (shape, dtype); staging_buffers takes from it, allocating what it lacks."""

    def __init__(self, pin: bool | None = None):
        self.pin = torch.cuda.is_available() if pin is None else pin
        self.free: dict[Key, list[torch.Tensor]] = defaultdict(list)

    @classmethod
    def for_training(cls, model_state: dict, params: list[torch.Tensor], slots: int, pin: bool | None = None):
        """Buffers for every tensor of the model's state dict and `slots` per parameter (local shards)."""
        pool = cls(pin)
        for t in list(model_state.values()) + [p for p in params for _ in range(slots)]:
            if isinstance(t, torch.Tensor) and t.dim() > 0:
                local = _local(t)
                pool.free[(tuple(local.shape), local.dtype)].append(pool._new(local))
        return pool

    def _new(self, t: torch.Tensor) -> torch.Tensor:
        return torch.empty(tuple(t.shape), dtype=t.dtype, pin_memory=self.pin and t.numel() > 0)

    def buffer(self, t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 0:  # as torch's stager: scalars (AdamW's step) are plain CPU scalars
            return torch.zeros((), dtype=t.dtype)
        free = self.free.get((tuple(t.shape), t.dtype))
        return free.pop() if free else self._new(t)

    def staging_buffers(self, state: Any) -> Any:
        """CPU tensors shaped as every tensor in `state` (nested dicts/lists as DCP state dicts are);
        other leaves are kept as they are. A DTensor's buffer is a DTensor with the same sharding
        spec around a CPU local tensor (what `DTensor.to("cpu")` gives, without the copy)."""
        if isinstance(state, DTensor):
            if state.dim() == 0:
                return state
            return DTensor(self.buffer(state._local_tensor), state._spec, requires_grad=False)
        if isinstance(state, torch.Tensor):
            return self.buffer(state)
        if isinstance(state, dict):
            return {k: self.staging_buffers(v) for k, v in state.items()}
        if isinstance(state, (list, tuple)):
            return type(state)(self.staging_buffers(v) for v in state)
        return state

    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for ts in self.free.values() for t in ts)


def staging_buffers(state: Any, pin: bool | None = None) -> Any:
    """Buffers for `state` allocated now (BufferPool.staging_buffers of an empty pool)."""
    return BufferPool(pin).staging_buffers(state)
