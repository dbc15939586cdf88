"""The versioned weight store: the trainer publishes version v, generators pull the newest.

The trainer snapshot-copies its weights (`snapshot_state_dict`, the only stall on the training
thread) and calls `publish`; serialisation (safetensors, Hugging Face names) runs off the event
loop, the files appear atomically, then the broker hash `weights:latest` moves forward. A
generator polls `latest()`, `fetch`es the version into a local directory while it keeps
generating, and hands that directory to vLLM's `reload_weights`.

    store = make_weight_store(cfg, broker, run_dir)
    handle = await store.publish(3, snapshot_state_dict(model.state_dict()))
    newest = await store.latest(); local_dir = await store.fetch(newest)

Backends (cfg.weights.backend) live in `streamrl.weightstores`, one module each, imported lazily.
"""

from __future__ import annotations

import asyncio
import importlib
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

import structlog
import torch

from streamrl.broker import Broker, Keys
from streamrl.config import Config
from streamrl.errors import ConfigError, StreamRLError

BACKENDS: dict[str, str] = {
    "shm": "streamrl.weightstores.shm:ShmWeightStore",
    "dir": "streamrl.weightstores.directory:DirectoryWeightStore",
    "cuda_ipc": "streamrl.weightstores.cuda_ipc:CudaIpcWeightStore",
    "torchstore": "streamrl.weightstores.torchstore:TorchStoreWeightStore",
}
"""backend name -> `module:class` (imported only when chosen: optional dependencies stay optional)."""


class WeightStoreError(StreamRLError, RuntimeError):
    """A published version could not be written, found or fetched."""


@dataclass
class WeightHandle:
    """Where version `version` lives; stored as the broker hash `weights:latest`."""

    version: int
    transport: str
    """Backend name that wrote it (`shm`, `dir`)."""
    handle: str
    """Backend-specific locator: for the file backends, the version's directory."""
    bytes: int
    created_at: float = field(default_factory=time.time)
    """Wall-clock time the publish started (switch latency is measured from here)."""

    def to_mapping(self) -> dict[str, str | int | float]:
        return asdict(self)

    @classmethod
    def from_mapping(cls, raw: dict[str, bytes]) -> "WeightHandle":
        def s(key: str) -> str:
            value = raw[key]
            return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)

        try:
            return cls(version=int(s("version")), transport=s("transport"), handle=s("handle"),
                       bytes=int(s("bytes")), created_at=float(s("created_at")))
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


def snapshot_state_dict(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU copies, so training may continue while the copies are serialised.

    Sharded (DTensor) parameters must be gathered by the caller first (e.g. torch.distributed
    checkpoint's `get_model_state_dict(..., full_state_dict=True, cpu_offload=True)`).
    """
    out: dict[str, torch.Tensor] = {}
    for name, tensor in sd.items():
        t = tensor.detach()
        # clone() also breaks storage sharing (tied weights), which safetensors refuses to save.
        out[name] = t.to("cpu", copy=True).contiguous() if t.device.type != "cpu" else t.clone().contiguous()
    return out


class WeightStore(ABC):
    """Versioned weights: publish (trainer), latest / fetch (generators), gc (publisher)."""

    transport: str = ""
    vllm_extension: str | None = None
    """vLLM `worker_extension_cls` a generator needs to load this backend's versions (None: none)."""
    hooks_in_thread: bool = True
    """Run _write/_fetch in a worker thread (they serialise or copy bytes). False for backends whose
    hooks are a few cheap calls: a thread hop in a busy process can wait seconds for the GIL."""

    def __init__(self, broker: Broker, keys: Keys, keep: int):
        self.broker = broker
        self.keys = keys
        self.keep = keep
        self.log = structlog.get_logger("streamrl").bind(component="weights", transport=self.transport)

    # -- backend hooks (blocking; called via asyncio.to_thread) ---------------------------------
    @abstractmethod
    def _write(self, version: int, state_dict: dict[str, torch.Tensor]) -> tuple[str, int]:
        """Persist one version atomically; return (handle, bytes)."""

    @abstractmethod
    def _fetch(self, handle: WeightHandle) -> str:
        """Make the version readable locally; return the directory vLLM reloads from."""

    @abstractmethod
    def _collect(self, keep_versions: set[int]) -> list[int]:
        """Delete every stored version not in `keep_versions`; return the deleted ones."""

    @abstractmethod
    def _versions(self) -> list[int]:
        """Versions currently stored (for gc)."""

    # -- public API ----------------------------------------------------------------------------
    async def publish(self, version: int, state_dict: dict[str, torch.Tensor]) -> WeightHandle:
        """Serialise off the loop, write atomically, advance `weights:latest` (never backwards), gc."""
        if version < 0:
            raise WeightStoreError(f"weight version must be >= 0, got {version}")
        created = time.time()
        handle, size = (await asyncio.to_thread(self._write, version, state_dict) if self.hooks_in_thread
                        else self._write(version, state_dict))
        wh = WeightHandle(version=version, transport=self.transport, handle=handle, bytes=size, created_at=created)
        # One publisher per run (trainer rank 0), so read-compare-write needs no server-side CAS.
        current = await self.latest()
        if current is None or version > current.version:
            await self.broker.hset(self.keys.weights_latest, wh.to_mapping())
        else:
            self.log.warning("publish_not_newer", version=version, latest=current.version)
        self.log.info("weights_published", policy_version=version, bytes=size,
                      seconds=round(time.time() - created, 4))
        await self.gc()
        return wh

    async def latest(self) -> WeightHandle | None:
        raw = await self.broker.hgetall(self.keys.weights_latest)
        return WeightHandle.from_mapping(raw) if raw else None

    async def fetch(self, handle: WeightHandle) -> str:
        """A local directory holding `model.safetensors` of `handle.version` (copied off the loop)."""
        if handle.transport != self.transport:
            raise WeightStoreError(
                f"version {handle.version} was published with transport {handle.transport!r} but this "
                f"process uses {self.transport!r}; set weights.backend={handle.transport} for every role"
            )
        return await asyncio.to_thread(self._fetch, handle) if self.hooks_in_thread else self._fetch(handle)

    async def gc(self) -> None:
        """Keep the newest `keep` versions (and always the one `weights:latest` names)."""
        versions = sorted(await asyncio.to_thread(self._versions))
        keep = set(versions[-self.keep:])
        current = await self.latest()
        if current is not None:
            keep.add(current.version)
        deleted = await asyncio.to_thread(self._collect, keep)
        if deleted:
            self.log.debug("weights_collected", versions=deleted)

    async def close(self) -> None:
        """Release local resources (fetched copies). The published versions stay."""

    @classmethod
    def gather(cls, engine) -> dict[str, torch.Tensor] | None:
        """Collective on every trainer rank: what rank 0 publishes (None on other ranks)."""
        return engine.full_state_dict()

    def reload_call(self, local: str) -> tuple[str, dict]:
        """The vLLM `collective_rpc` (method, kwargs) that loads what `fetch` returned."""
        return "reload_weights", {"weights_path": local}


def make_weight_store(cfg: Config, broker: Broker, run_dir: Path | None) -> WeightStore:
    """The backend cfg.weights.backend names, for this run (run_dir: default place of the `dir` backend)."""
    cls = backend_class(cfg.weights.backend)
    return cls.from_config(cfg, broker, Path(run_dir) if run_dir is not None else None)


def backend_class(name: str) -> type[WeightStore]:
    """The WeightStore class registered as `name` (its module imported now)."""
    target = BACKENDS.get(name)
    if target is None:
        raise ConfigError(f"weights.backend={name!r} is unknown; choose one of {sorted(BACKENDS)}")
    module_name, cls_name = target.split(":")
    return getattr(importlib.import_module(module_name), cls_name)
