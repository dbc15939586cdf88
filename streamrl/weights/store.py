"""The versioned weight store: the trainer publishes version v, generators pull the newest.

Two sides, one backend (cfg.weights.backend) for both:
- trainer side, `WeightPublisher`: on every trainer rank `snapshot(engine)` takes the weights
  through the engine interface (WeightSource: HF-named full tensors; the only stall on the training
  thread), then rank 0 `publish`es them: the backend writes the version (off the event loop where
  that is slow), then the broker hash `weights:latest` moves forward, then old versions are
  collected.
- generator side, `WeightLoader`: `latest()` polls the hash, `fetch` makes the version readable in
  this process while generation continues (a local directory for the file backends, a GPU buffer
  handle for cuda_ipc) and `reload_call` is the vLLM `collective_rpc` that loads what fetch returned.

    state = publisher_class(cfg.weights.backend).snapshot(engine, cfg.model.dtype)   # every rank
    handle = await make_publisher(cfg, broker, run_dir).publish(3, state)            # rank 0
    loader = make_loader(cfg, broker, run_dir)
    newest = await loader.latest(); local = await loader.fetch(newest)
    await vllm.collective_rpc(*loader.reload_call(local))

Backends live in `streamrl.weights`, one module (or a publisher and a loader module) each,
imported lazily.
"""

from __future__ import annotations

import asyncio
import importlib
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import structlog
import torch

from streamrl.config.schema import Config
from streamrl.core.broker import Broker, Keys
from streamrl.core.errors import ConfigError, StreamRLError
from streamrl.weights.lora import adapter_json

BACKENDS: dict[str, tuple[str, str]] = {
    "shm": ("streamrl.weights.shm:ShmPublisher", "streamrl.weights.shm:ShmLoader"),
    "dir": ("streamrl.weights.directory:DirectoryPublisher", "streamrl.weights.directory:DirectoryLoader"),
    "cuda_ipc": (
        "streamrl.weights.cuda_ipc_publish:CudaIpcPublisher",
        "streamrl.weights.cuda_ipc_load:CudaIpcLoader",
    ),
    "torchstore": (
        "streamrl.weights.torchstore:TorchStorePublisher",
        "streamrl.weights.torchstore:TorchStoreLoader",
    ),
    "mooncake": ("streamrl.weights.mooncake:MooncakePublisher", "streamrl.weights.mooncake:MooncakeLoader"),
}
"""backend name -> (`module:class` of its publisher, of its loader); imported only when chosen, so
optional dependencies stay optional."""


class WeightStoreError(StreamRLError, RuntimeError):
    """A published version could not be written, found or fetched."""


@dataclass
class WeightHandle:
    """Where version `version` lives; stored as the broker hash `weights:latest`."""

    version: int
    transport: str
    """Backend name that wrote it (`shm`, `dir`, `cuda_ipc`, `torchstore`)."""
    handle: str
    """Backend-specific locator: the version's directory (file backends), the encoded CUDA IPC
    buffer handle (cuda_ipc), the store key (torchstore)."""
    bytes: int
    created_at: float = field(default_factory=time.time)
    """Wall-clock time the publish started (switch latency is measured from here)."""
    adapter: str = ""
    """The version is a LoRA adapter (trainer.lora): its PEFT adapter config as JSON; "" for full
    weights. A loader's fetch then gives a PEFT folder (streamrl.weights.lora)."""

    @property
    def is_adapter(self) -> bool:
        return bool(self.adapter)

    def to_mapping(self) -> dict[str, str | int | float]:
        return asdict(self)

    @classmethod
    def from_mapping(cls, raw: dict[str, bytes]) -> "WeightHandle":
        def s(key: str) -> str:
            value = raw[key]
            return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)

        try:
            return cls(
                version=int(s("version")),
                transport=s("transport"),
                handle=s("handle"),
                bytes=int(s("bytes")),
                created_at=float(s("created_at")),
                adapter=s("adapter") if "adapter" in raw else "",  # absent: written before adapters existed
            )
        except (KeyError, ValueError) as exc:
            raise WeightStoreError(
                f"broker hash weights:latest is malformed ({exc!r}); it must hold version, transport, "
                "handle, bytes, created_at. Delete the key to let the trainer republish."
            ) from None


@dataclass
class WeightStream:
    """A trainer engine's full weights, one tensor at a time (TrainerEngine.weight_stream): what a
    publisher that places the tensors itself (cuda_ipc packs them into one GPU buffer) is given.

    Collective: every rank must run `tensors` to its end (each step may gather one parameter)."""

    layout: list[tuple[str, torch.dtype, list[int]]]
    """(Hugging Face name, dtype, shape) of each tensor, in the order `tensors` yields them; tied
    weights appear once. Empty where `receiver` is False and the engine gathers nothing per tensor."""
    tensors: Iterator[torch.Tensor | None]
    """Full tensors on the receiving rank (possibly live parameters: copy them before training
    continues), None on the others."""
    receiver: bool
    """True on the rank that receives the values (rank 0)."""


class WeightSource(Protocol):
    """What a publisher's snapshot reads: the trainer engine interface (streamrl/train/engine_interface.py)."""

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Full HF-named weights as CPU copies on rank 0, None elsewhere; collective."""

    def weight_stream(self) -> WeightStream:
        """Full HF-named tensors one at a time; collective."""


def module_weight_stream(module: torch.nn.Module, receiver: bool) -> WeightStream:
    """The stream of a module whose parameter names are already Hugging Face's (a transformers
    model, FSDP2-sharded or not): one parameter all-gathered at a time (DTensor.full_tensor), so no
    rank ever holds a full copy; tied weights once (under their first name)."""
    seen, layout, tensors = set(), [], []
    for name, t in module.state_dict(keep_vars=True).items():  # keep_vars: tied weights are one object
        if id(t) in seen:
            continue
        seen.add(id(t))
        layout.append((name, t.dtype, list(t.shape)))
        tensors.append(t)

    def values():
        with torch.no_grad():
            for t in tensors:
                full = t
                if hasattr(t, "full_tensor"):  # DTensor: one rank holds it all already, else gather this one
                    full = t.to_local() if t.device_mesh.size() == 1 else t.full_tensor()
                yield full.detach() if receiver else None

    return WeightStream(layout, values(), receiver)


def snapshot_state_dict(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A publishable copy of a state dict of live tensors: detached, contiguous CPU copies (tied
    storage broken), so training may continue while a publisher writes them. For callers holding
    plain modules' tensors (tests, scripts); the trainer engines' full_state_dict already returns
    copies. Sharded (DTensor) parameters must be gathered first."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in sd.items():
        t = tensor.detach()
        # clone() also breaks storage sharing (tied weights), which safetensors refuses to save.
        out[name] = t.to("cpu", copy=True).contiguous() if t.device.type != "cpu" else t.clone().contiguous()
    return out


class _VersionReader:
    """What both sides read: the broker hash `weights:latest`."""

    transport: str = ""

    def __init__(self, broker: Broker, keys: Keys):
        self.broker = broker
        self.keys = keys
        self.log = structlog.get_logger("streamrl").bind(component="weights", transport=self.transport)

    async def latest(self) -> WeightHandle | None:
        raw = await self.broker.hgetall(self.keys.weights_latest)
        return WeightHandle.from_mapping(raw) if raw else None


class WeightPublisher(_VersionReader, ABC):
    """Trainer side: snapshot (every rank, collective), publish and gc (rank 0: one publisher per run)."""

    hooks_in_thread: bool = True
    """Run _write in a worker thread (it serialises or copies bytes). False for backends whose hook
    is a few cheap calls: a thread hop in a busy process can wait seconds for the GIL."""

    def __init__(self, broker: Broker, keys: Keys, keep: int):
        super().__init__(broker, keys)
        self.keep = keep

    @classmethod
    def snapshot(cls, source: WeightSource, dtype: str) -> object | None:
        """Collective on every trainer rank: what rank 0 then publishes (None on other ranks).
        The file backends publish the engine's full state dict as is (`dtype` is unused: the
        checkpoint's dtypes are kept)."""
        return source.full_state_dict()

    # -- backend hooks (blocking; called via asyncio.to_thread when hooks_in_thread) ------------
    @abstractmethod
    def _write(self, version: int, state, adapter: str = "") -> tuple[str, int]:
        """Persist one version (what snapshot returned) atomically; return (handle, bytes).
        `adapter`: the PEFT config JSON when `state` is an adapter's tensors (else "")."""

    @abstractmethod
    def _collect(self, keep_versions: set[int]) -> list[int]:
        """Delete every stored version not in `keep_versions`; return the deleted ones."""

    @abstractmethod
    def _versions(self) -> list[int]:
        """Versions currently stored (for gc)."""

    # -- public API ----------------------------------------------------------------------------
    async def publish(self, version: int, state, adapter: dict | None = None) -> WeightHandle:
        """Write atomically, advance `weights:latest` (never backwards), gc. `adapter`: the PEFT
        LoraConfig.to_dict() when `state` holds only the adapter's tensors (trainer.lora)."""
        if version < 0:
            raise WeightStoreError(f"weight version must be >= 0, got {version}")
        config = adapter_json(state, adapter) if adapter is not None else ""
        created = time.time()
        handle, size = (
            await asyncio.to_thread(self._write, version, state, config)
            if self.hooks_in_thread
            else self._write(version, state, config)
        )
        wh = WeightHandle(
            version=version, transport=self.transport, handle=handle, bytes=size, created_at=created, adapter=config
        )
        await self._advance(wh)
        self.log.info("weights_published", policy_version=version, bytes=size, seconds=round(time.time() - created, 4))
        await self.gc()
        return wh

    async def _advance(self, wh: WeightHandle) -> None:
        # One publisher per run (trainer rank 0), so read-compare-write needs no server-side CAS.
        current = await self.latest()
        if current is None or wh.version > current.version:
            await self.broker.hset(self.keys.weights_latest, wh.to_mapping())
            # the wake-up of generators blocked in WeightLoader.wait_for_publish (the hash stays the truth)
            await self.broker.add(self.keys.weights_published, str(wh.version).encode(), maxlen=16)
        else:
            self.log.warning("publish_not_newer", version=wh.version, latest=current.version)

    async def gc(self) -> None:
        """Keep the newest `keep` versions (and always the one `weights:latest` names)."""
        versions = sorted(await asyncio.to_thread(self._versions))
        keep = set(versions[-self.keep :])
        current = await self.latest()
        if current is not None:
            keep.add(current.version)
        deleted = await asyncio.to_thread(self._collect, keep)
        if deleted:
            self.log.debug("weights_collected", versions=deleted)

    async def close(self) -> None:
        """Release what this process holds. The published versions stay (except where the backend's
        memory is this process's, cuda_ipc)."""


class WeightLoader(_VersionReader, ABC):
    """Generator side: latest, fetch (while generating), and the vLLM RPC that loads a fetched version."""

    vllm_extension: str | None = None
    """vLLM `worker_extension_cls` a generator needs to load this backend's versions (None: none)."""
    hooks_in_thread: bool = True
    """Run _fetch in a worker thread (it copies bytes); False where it is a few cheap calls."""
    _published_id: str = "0"
    local_copies: int = 2
    """Fetched versions kept on this host (backends that copy): the loaded one and the prefetched one,
    or with LoRA every adapter vLLM may still re-read (the generator raises it to max_loras + 1)."""

    async def wait_for_publish(self, timeout_s: float) -> None:
        """Return when a version is published (an entry on `weights:published` newer than the last one
        seen here) or after `timeout_s`; the caller then reads `latest()`. The first call returns at once."""
        entries = await self.broker.read(
            self.keys.weights_published, self._published_id, count=16, block_ms=max(1, int(timeout_s * 1000))
        )
        if entries:
            self._published_id = entries[-1].id

    def adapter_call(self, handle: WeightHandle, request) -> tuple[str, dict] | None:
        """The vLLM `collective_rpc` (method, kwargs) that adds adapter version `handle` as LoRARequest
        `request` from memory; None: vLLM's add_lora reads the folder `fetch` returned."""
        return None

    def settle(self, handle: WeightHandle, local: str) -> None:
        """Blocking, after adapter version `handle` is in the engine: complete its folder `local` where
        fetch left part of it for later (vLLM re-reads it only after evicting it). Nothing by default."""

    @abstractmethod
    def _fetch(self, handle: WeightHandle) -> str:
        """Make the version readable in this process; return what reload_call takes."""

    async def fetch(self, handle: WeightHandle) -> str:
        """Make `handle.version` readable here; returns the locator reload_call takes: a local
        directory holding `model.safetensors` (file backends, torchstore) or the buffer handle (cuda_ipc).
        An adapter version (handle.is_adapter) gives a local PEFT folder on every backend."""
        if handle.transport != self.transport:
            raise WeightStoreError(
                f"version {handle.version} was published with transport {handle.transport!r} but this "
                f"process uses {self.transport!r}; set weights.backend={handle.transport} for every role"
            )
        return await asyncio.to_thread(self._fetch, handle) if self.hooks_in_thread else self._fetch(handle)

    def reload_call(self, local: str) -> tuple[str, dict]:
        """The vLLM `collective_rpc` (method, kwargs) that loads what `fetch` returned."""
        return "reload_weights", {"weights_path": local}

    async def close(self) -> None:
        """Release local resources (fetched copies). The published versions stay."""


def _import(target: str):
    module_name, cls_name = target.split(":")
    return getattr(importlib.import_module(module_name), cls_name)


def _targets(name: str) -> tuple[str, str]:
    targets = BACKENDS.get(name)
    if targets is None:
        raise ConfigError(f"weights.backend={name!r} is unknown; choose one of {sorted(BACKENDS)}")
    return targets


def publisher_class(name: str) -> type[WeightPublisher]:
    """The publisher class of backend `name` (its module imported now); its snapshot needs no broker."""
    return _import(_targets(name)[0])


def loader_class(name: str) -> type[WeightLoader]:
    return _import(_targets(name)[1])


def make_publisher(cfg: Config, broker: Broker, run_dir: Path | None) -> WeightPublisher:
    """The trainer's publisher for cfg.weights.backend (run_dir: default place of the `dir` backend)."""
    return publisher_class(cfg.weights.backend).from_config(cfg, broker, Path(run_dir) if run_dir is not None else None)


def make_loader(cfg: Config, broker: Broker, run_dir: Path | None) -> WeightLoader:
    """A generator's loader for cfg.weights.backend (run_dir: where its local copies go)."""
    return loader_class(cfg.weights.backend).from_config(cfg, broker, Path(run_dir) if run_dir is not None else None)
