"""`cuda_ipc` backend: trainer and generators on one GPU host share each version's GPU copy, no bytes moved.

The trainer (cuda_ipc_publish.py) packs every (HF-named) tensor of version v into one flat GPU
buffer, one tensor gathered at a time (the engine's weight stream), so FSDP ranks never hold a full
copy; the copies are queued on the GPU, so the training loop pays only their launch. `publish`
exports the buffer's CUDA IPC handle and the broker hash carries it; the trainer keeps the newest
`weights.keep` buffers alive.

A generator's vLLM worker (cuda_ipc_load.py) maps the buffer (CUDA IPC), views each tensor in
place and hands them to vLLM's model loader. That runs inside vLLM's worker process through a
worker extension (`VLLMIpcExtension`, vLLM's `worker_extension_cls`) reached with
`collective_rpc("streamrl_reload_ipc", kwargs={"spec": ...})`: the RPC carries only a string, so
vLLM keeps its default multi-process engine (no VLLM_ENABLE_V1_MULTIPROCESSING=0, no pickled
callables) and the same call works with tensor-parallel workers. Works on vLLM 0.26 (GPU).

This module is the wire format both sides share. No pickle:
`torch.multiprocessing.reductions.reduce_tensor` gives the rebuild arguments; the classes in them
are fixed (torch.Tensor over a TypedStorage, uint8) and are re-supplied by the reader, the rest
(sizes, offsets, the IPC/ref-counter/event handles as bytes, the device's UUID so differing
CUDA_VISIBLE_DEVICES map right) travels as base64 msgpack.

    streamrl up --config configs/qwen3-1.7b-gpu.yaml            # weights.backend: cuda_ipc
"""

from __future__ import annotations

import base64
import os
import socket
from dataclasses import dataclass

import msgpack
import torch

from streamrl.weights.store import WeightStoreError

ALIGN = 256
"""Byte alignment of each tensor in the flat buffer (vLLM's kernels like aligned weights)."""
SPEC_VERSION = 1


@dataclass
class PackedState:
    """One version: a flat uint8 CUDA buffer and (name, dtype, shape, byte offset) per tensor."""

    buffer: torch.Tensor
    entries: list[tuple[str, str, list[int], int]]

    def tensors(self, buffer: torch.Tensor | None = None):
        """(name, view) pairs over `buffer` (default: this one's); no copies."""
        flat = self.buffer if buffer is None else buffer
        for name, dtype, shape, off in self.entries:
            dt = getattr(torch, dtype)
            n = _numel(shape) * dt.itemsize
            yield name, flat[off : off + n].view(dt).view(shape)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def buffer_layout(items: list[tuple[str, torch.dtype, list[int]]]) -> tuple[list[tuple[str, str, list[int], int]], int]:
    entries, off = [], 0
    for name, dt, shape in items:
        entries.append((name, str(dt).removeprefix("torch."), list(shape), off))
        off += -(-_numel(shape) * dt.itemsize // ALIGN) * ALIGN
    return entries, max(off, ALIGN)


def _device_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


def encode_spec(packed: PackedState) -> str:
    """The IPC handle of `packed.buffer` plus the tensor index, as base64 msgpack (no pickle)."""
    from torch.multiprocessing.reductions import reduce_tensor

    _, args = reduce_tensor(packed.buffer)
    (
        tensor_cls,
        size,
        stride,
        toff,
        storage_cls,
        dtype,
        device,
        handle,
        nbytes,
        soff,
        _rg,
        ref_handle,
        ref_off,
        ev_handle,
        ev_sync,
    ) = args
    if tensor_cls is not torch.Tensor or storage_cls is not torch.storage.TypedStorage or dtype != torch.uint8:
        raise WeightStoreError(
            f"unexpected CUDA IPC reduction ({tensor_cls}, {storage_cls}, {dtype}); "
            "this torch version changed reduce_tensor: use weights.backend=shm"
        )
    spec = {
        "v": SPEC_VERSION,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "uuid": _device_uuid(device),
        "size": list(size),
        "stride": list(stride),
        "toff": toff,
        "handle": handle,
        "nbytes": nbytes,
        "soff": soff,
        "ref": ref_handle,
        "ref_off": ref_off,
        "event": ev_handle,
        "ev_sync": bool(ev_sync),
        "entries": packed.entries,
    }
    return base64.b64encode(msgpack.packb(spec, use_bin_type=True)).decode()


def decode_spec(text: str) -> dict:
    try:
        spec = msgpack.unpackb(base64.b64decode(text), raw=False)
    except Exception as exc:
        raise WeightStoreError(
            f"cuda_ipc handle does not decode ({exc!r}); every role must run this streamrl"
        ) from None
    if spec.get("v") != SPEC_VERSION:
        raise WeightStoreError(f"cuda_ipc handle version {spec.get('v')} != {SPEC_VERSION}; upgrade every role")
    return spec


def open_spec(spec: dict) -> PackedState:
    """Map the publisher's buffer into this process (read-only use; the publisher owns it)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    if spec["host"] != socket.gethostname():
        raise WeightStoreError(
            f"weights were published over CUDA IPC on host {spec['host']!r}, this is "
            f"{socket.gethostname()!r}; across hosts use weights.backend=dir or torchstore"
        )
    local = [i for i in range(torch.cuda.device_count()) if _device_uuid(i) == spec["uuid"]]
    if not local:
        raise WeightStoreError(
            f"the publisher's GPU {spec['uuid']} is not visible here; "
            "make it visible to the generator (CUDA_VISIBLE_DEVICES) or use weights.backend=shm"
        )
    buf = rebuild_cuda_tensor(
        torch.Tensor,
        tuple(spec["size"]),
        tuple(spec["stride"]),
        spec["toff"],
        torch.storage.TypedStorage,
        torch.uint8,
        local[0],
        spec["handle"],
        spec["nbytes"],
        spec["soff"],
        False,
        spec["ref"],
        spec["ref_off"],
        spec["event"],
        spec["ev_sync"],
    )
    return PackedState(buf, [tuple(e) for e in spec["entries"]])
