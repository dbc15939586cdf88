"""`cuda_ipc` backend: trainer and generators on one GPU host share each version's GPU copy, no bytes moved.

The trainer packs every (HF-named) tensor of version v into one flat GPU buffer (`gather`: one
tensor gathered at a time, so FSDP ranks never hold a full copy; the copies are queued on the GPU,
so the training loop pays only their launch). `publish` exports the buffer's CUDA IPC handle and
the broker hash carries it; the trainer keeps the newest `weights.keep` buffers alive.

A generator's vLLM worker maps the buffer (CUDA IPC), views each tensor in place and hands them
to vLLM's in-place `reload_weights(weights_iterator=...)`. That runs inside vLLM's worker process
through a worker extension (`VLLMIpcExtension`, vLLM's `worker_extension_cls`) reached with
`collective_rpc("streamrl_reload_ipc", kwargs={"spec": ...})`: the RPC carries only a string, so
vLLM keeps its default multi-process engine (no VLLM_ENABLE_V1_MULTIPROCESSING=0, no pickled
callables) and the same call works with tensor-parallel workers. Works on vLLM 0.26 (GPU).

Wire format (no pickle): `torch.multiprocessing.reductions.reduce_tensor` gives the rebuild
arguments; the classes in them are fixed (torch.Tensor over a TypedStorage, uint8) and are
re-supplied by the reader, the rest (sizes, offsets, the IPC/ref-counter/event handles as bytes,
the device's UUID so differing CUDA_VISIBLE_DEVICES map right) travels as base64 msgpack.

    streamrl up --config configs/qwen3-1.7b-gpu.yaml            # weights.backend: cuda_ipc
"""

from __future__ import annotations

import base64
import os
import socket
from dataclasses import dataclass

import msgpack
import torch

from streamrl.broker import Broker, Keys
from streamrl.config import Config
from streamrl.errors import ConfigError
from streamrl.weights import WeightHandle, WeightStore, WeightStoreError

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
            yield name, flat[off:off + n].view(dt).view(shape)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _layout(items: list[tuple[str, torch.dtype, list[int]]]) -> tuple[list[tuple[str, str, list[int], int]], int]:
    entries, off = [], 0
    for name, dt, shape in items:
        entries.append((name, str(dt).removeprefix("torch."), list(shape), off))
        off += -(-_numel(shape) * dt.itemsize // ALIGN) * ALIGN
    return entries, max(off, ALIGN)


def pack_state_dict(sd: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype | None = None) -> PackedState:
    """Copy a state dict into one flat buffer on `device` (floating tensors cast to `dtype` if given)."""
    def target(t):
        return dtype if dtype is not None and t.is_floating_point() else t.dtype

    entries, size = _layout([(k, target(t), list(t.shape)) for k, t in sd.items()])
    packed = PackedState(torch.empty(size, dtype=torch.uint8, device=device), entries)
    with torch.no_grad():
        for (_, view), t in zip(packed.tensors(), sd.values()):
            view.copy_(t.detach(), non_blocking=True)
    return packed


def gather_packed(model: torch.nn.Module, device: torch.device, dtype: torch.dtype, rank: int) -> PackedState | None:
    """Collective over the trainer ranks: the full HF-named weights packed on rank 0's GPU, None elsewhere.

    One parameter is all-gathered at a time (DTensor.full_tensor), so no rank ever holds a full
    copy besides rank 0's packed buffer. Tied weights appear once (under their first name).
    """
    seen, items, tensors = set(), [], []
    for name, t in model.state_dict(keep_vars=True).items():  # keep_vars: tied weights are one object
        if id(t) in seen:
            continue
        seen.add(id(t))
        items.append((name, dtype if t.is_floating_point() else t.dtype, list(t.shape)))
        tensors.append(t)
    entries, size = _layout(items)
    packed = PackedState(torch.empty(size, dtype=torch.uint8, device=device), entries) if rank == 0 else None
    views = packed.tensors() if packed is not None else None
    with torch.no_grad():
        for t in tensors:
            if hasattr(t, "full_tensor"):  # DTensor: one rank holds it all already, else gather this one
                full = t.to_local() if t.device_mesh.size() == 1 else t.full_tensor()
            else:
                full = t
            if packed is not None:
                next(views)[1].copy_(full.detach(), non_blocking=True)
    return packed


def _device_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


def encode_spec(packed: PackedState) -> str:
    """The IPC handle of `packed.buffer` plus the tensor index, as base64 msgpack (no pickle)."""
    from torch.multiprocessing.reductions import reduce_tensor

    _, args = reduce_tensor(packed.buffer)
    (tensor_cls, size, stride, toff, storage_cls, dtype, device, handle, nbytes, soff, _rg,
     ref_handle, ref_off, ev_handle, ev_sync) = args
    if tensor_cls is not torch.Tensor or storage_cls is not torch.storage.TypedStorage or dtype != torch.uint8:
        raise WeightStoreError(f"unexpected CUDA IPC reduction ({tensor_cls}, {storage_cls}, {dtype}); "
                               "this torch version changed reduce_tensor: use weights.backend=shm")
    spec = {"v": SPEC_VERSION, "host": socket.gethostname(), "pid": os.getpid(), "uuid": _device_uuid(device),
            "size": list(size), "stride": list(stride), "toff": toff, "handle": handle, "nbytes": nbytes,
            "soff": soff, "ref": ref_handle, "ref_off": ref_off, "event": ev_handle, "ev_sync": bool(ev_sync),
            "entries": packed.entries}
    return base64.b64encode(msgpack.packb(spec, use_bin_type=True)).decode()


def decode_spec(text: str) -> dict:
    try:
        spec = msgpack.unpackb(base64.b64decode(text), raw=False)
    except Exception as exc:
        raise WeightStoreError(f"cuda_ipc handle does not decode ({exc!r}); every role must run this streamrl") from None
    if spec.get("v") != SPEC_VERSION:
        raise WeightStoreError(f"cuda_ipc handle version {spec.get('v')} != {SPEC_VERSION}; upgrade every role")
    return spec


def open_spec(spec: dict) -> PackedState:
    """Map the publisher's buffer into this process (read-only use; the publisher owns it)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    if spec["host"] != socket.gethostname():
        raise WeightStoreError(f"weights were published over CUDA IPC on host {spec['host']!r}, this is "
                               f"{socket.gethostname()!r}; across hosts use weights.backend=dir or torchstore")
    local = [i for i in range(torch.cuda.device_count()) if _device_uuid(i) == spec["uuid"]]
    if not local:
        raise WeightStoreError(f"the publisher's GPU {spec['uuid']} is not visible here; "
                               "make it visible to the generator (CUDA_VISIBLE_DEVICES) or use weights.backend=shm")
    buf = rebuild_cuda_tensor(
        torch.Tensor, tuple(spec["size"]), tuple(spec["stride"]), spec["toff"], torch.storage.TypedStorage,
        torch.uint8, local[0], spec["handle"], spec["nbytes"], spec["soff"], False, spec["ref"], spec["ref_off"],
        spec["event"], spec["ev_sync"])
    return PackedState(buf, [tuple(e) for e in spec["entries"]])


class CudaIpcWeightStore(WeightStore):
    transport = "cuda_ipc"
    vllm_extension = "streamrl.weightstores.cuda_ipc.VLLMIpcExtension"
    # Exporting or decoding a handle is a few cheap calls: inline. On a helper thread it queues for the
    # GIL behind a busy generator's event loop in the same process (docs/performance.md, "Weight sync").
    hooks_in_thread = False

    def __init__(self, broker: Broker, keys: Keys, keep: int, dtype: str):
        super().__init__(broker, keys, keep)
        self.dtype = getattr(torch, dtype)
        self._held: dict[int, PackedState] = {}
        """Versions this process published and keeps alive (the publisher owns the GPU memory)."""

    @classmethod
    def from_config(cls, cfg: Config, broker: Broker, run_dir) -> "CudaIpcWeightStore":
        if not torch.cuda.is_available():
            raise ConfigError("weights.backend=cuda_ipc needs a CUDA GPU shared by trainer and generators; "
                              "on CPU set weights.backend=shm")
        return cls(broker, Keys(cfg.run.name), cfg.weights.keep, cfg.model.dtype)

    @classmethod
    def gather(cls, engine) -> PackedState | None:
        dtype = getattr(torch, engine.cfg.model.dtype)
        if engine.cfg.trainer.backend != "hf":
            # Non-HF module names (torchtitan): the engine's own gather converts them to HF names.
            sd = engine.full_state_dict()
            return None if sd is None else pack_state_dict(sd, engine.device, dtype)
        return gather_packed(engine.model, engine.device, dtype, engine.rank)

    def reload_call(self, local: str) -> tuple[str, dict]:
        return "streamrl_reload_ipc", {"spec": local}

    def _write(self, version: int, state) -> tuple[str, int]:
        packed = state if isinstance(state, PackedState) else pack_state_dict(
            state, torch.device("cuda", torch.cuda.current_device()), self.dtype)
        spec = encode_spec(packed)
        self._held[version] = packed
        return spec, packed.buffer.numel()

    def _fetch(self, handle: WeightHandle) -> str:
        decode_spec(handle.handle)  # fail here (with the fix) rather than inside vLLM's worker
        return handle.handle

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


class VLLMIpcExtension:
    """Methods added to vLLM's GPU worker (worker_extension_cls); runs in vLLM's worker process."""

    def streamrl_reload_ipc(self, spec: str) -> int:
        packed = open_spec(decode_spec(spec))
        device = self.device  # vLLM's worker attribute: the GPU its model lives on
        weights = ((name, t if t.device == device else t.to(device, non_blocking=True)) for name, t in packed.tensors())
        runner = self.model_runner
        with torch.no_grad():
            self._streamrl_load(runner, weights)
        torch.cuda.current_stream().synchronize()  # done reading before the publisher may reuse the memory
        n = len(packed.entries)
        del packed, weights
        return n

    def _streamrl_load(self, runner, weights) -> None:
        if getattr(runner.model_config, "quantization", None) is None:
            # Unquantized: the model's own loaders copy straight into the live parameters (what RL
            # frameworks do). vLLM's reload_weights would first move every layer to `meta` and
            # rebuild it, which only quantized/repacked weights need.
            runner.get_model().load_weights(weights)
        else:
            self.reload_weights(weights_iterator=weights)
