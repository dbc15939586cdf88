"""`cuda_ipc` backend, trainer side: pack the weights into one flat GPU buffer, export its IPC handle.

See cuda_ipc.py for the backend and its wire format; the generator side is cuda_ipc_load.py.
"""

from __future__ import annotations

import torch

from streamrl.config.schema import Config
from streamrl.core.broker import Broker, Keys
from streamrl.core.errors import ConfigError
from streamrl.weights.cuda_ipc import PackedState, buffer_layout, encode_spec
from streamrl.weights.store import WeightPublisher, WeightSource, WeightStream


def pack_state_dict(sd: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype | None = None) -> PackedState:
    """Copy a state dict into one flat buffer on `device` (floating tensors cast to `dtype` if given)."""

    def target(t):
        return dtype if dtype is not None and t.is_floating_point() else t.dtype

    entries, size = buffer_layout([(k, target(t), list(t.shape)) for k, t in sd.items()])
    packed = PackedState(torch.empty(size, dtype=torch.uint8, device=device), entries)
    with torch.no_grad():
        for (_, view), t in zip(packed.tensors(), sd.values()):
            view.copy_(t.detach(), non_blocking=True)
    return packed


def pack_stream(stream: WeightStream, device: torch.device, dtype: torch.dtype | None = None) -> PackedState | None:
    """Collective over the trainer ranks: the stream's tensors packed on the receiving rank's
    `device` (floating tensors cast to `dtype` if given), None elsewhere. The stream gathers one tensor at a
    time, so no rank holds a full copy besides the receiver's packed buffer."""
    if not stream.receiver:
        for _ in stream.tensors:  # every rank runs the stream: each step may be a collective
            pass
        return None
    entries, size = buffer_layout(
        [
            (name, dtype if dtype is not None and dt.is_floating_point else dt, shape)
            for name, dt, shape in stream.layout
        ]
    )
    packed = PackedState(torch.empty(size, dtype=torch.uint8, device=device), entries)
    with torch.no_grad():
        for (_, view), t in zip(packed.tensors(), stream.tensors, strict=True):
            view.copy_(t, non_blocking=True)
    return packed


class CudaIpcPublisher(WeightPublisher):
    transport = "cuda_ipc"
    # Exporting a handle is a few cheap calls: inline. On a helper thread it queues for the GIL behind
    # a busy generator's event loop in the same process (docs/performance.md, "Weight sync").
    hooks_in_thread = False

    def __init__(self, broker: Broker, keys: Keys, keep: int, dtype: str):
        super().__init__(broker, keys, keep)
        self.dtype = getattr(torch, dtype)
        self._held: dict[int, PackedState] = {}
        """Versions this process published and keeps alive (the publisher owns the GPU memory)."""

    @classmethod
    def from_config(cls, cfg: Config, broker: Broker, run_dir) -> "CudaIpcPublisher":
        if not torch.cuda.is_available():
            raise ConfigError(
                "weights.backend=cuda_ipc needs a CUDA GPU shared by trainer and generators; "
                "on CPU set weights.backend=shm"
            )
        return cls(broker, Keys.of(cfg), cfg.weights.keep, cfg.model.dtype)

    @classmethod
    def snapshot(cls, source: WeightSource, dtype: str) -> PackedState | None:
        """The engine's weight stream packed on this rank's GPU (streamrl.train.dist set it), in model.dtype."""
        return pack_stream(
            source.weight_stream(), torch.device("cuda", torch.cuda.current_device()), getattr(torch, dtype)
        )

    def _write(self, version: int, state, adapter: str = "") -> tuple[str, int]:
        # An adapter's tensors are packed like full weights but keep their dtype (the reader writes them
        # to a PEFT folder byte for byte; vLLM casts them itself); its config travels in the WeightHandle.
        packed = (
            state
            if isinstance(state, PackedState)
            else pack_state_dict(
                state, torch.device("cuda", torch.cuda.current_device()), None if adapter else self.dtype
            )
        )
        spec = encode_spec(packed)
        self._held[version] = packed
        return spec, packed.buffer.numel()

    def _versions(self) -> list[int]:
        return list(self._held)

    def _collect(self, keep_versions: set[int]) -> list[int]:
        gone = [v for v in self._held if v not in keep_versions]
        for v in gone:
            del self._held[v]  # torch keeps it in its IPC limbo while a reader still maps it
        if gone:
            torch.cuda.ipc_collect()
        return sorted(gone)

    async def close(self) -> None:
        self._held.clear()
