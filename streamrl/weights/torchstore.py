"""`torchstore` backend (optional extra): versions in a torchstore (Monarch actors; RDMA where the hosts have it).

The trainer `put_state_dict`s version v under key `streamrl/<run>/v<v>` and the broker hash names
the key; a reader `get_state_dict`s it and writes it once to local shared memory, so vLLM's
`reload_weights(weights_path=...)` loads it like the `shm` backend. Old keys are deleted by gc.

Scope: torchstore's storage volumes and controller are Monarch actors spawned by the process
that calls `initialize` (here: the first store to start), so publisher and readers must share
one Monarch program (the same process, or processes of one Monarch mesh). Separate `streamrl
worker` processes on several hosts need a Monarch host mesh; that wiring is not done yet: use
`weights.backend=dir` across hosts meanwhile.

Install (PyPI has only torchstore 0.1.2, which pins torch 2.9 and torchmonarch 0.1.2; its code
runs on torchmonarch 0.6.0, built for torch 2.13): `make torchstore`, i.e.
`pip install --no-deps torchstore==0.1.2 torchmonarch==0.6.0` plus their plain dependencies.
Without RDMA NICs (ibverbs) set TORCHSTORE_RDMA_ENABLED=0 (done here unless already set);
tensors then travel over Monarch's TCP channels.

    streamrl up --set weights.backend=torchstore
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from streamrl.config.schema import Config
from streamrl.core.broker import Broker, Keys
from streamrl.core.errors import ConfigError
from streamrl.weights.files import WEIGHTS_FILE, version_dirs, version_files
from streamrl.weights.lora import adapter_json, write_peft_dir
from streamrl.weights.shm import shm_root
from streamrl.weights.store import WeightHandle, WeightLoader, WeightPublisher, WeightStoreError

STORE_NAME = "TorchStore"
"""torchstore's default store name (its `keys()` only looks there)."""


def _has_rdma() -> bool:
    """An InfiniBand/RoCE device is present (what torchstore's RDMA transport needs)."""
    return Path("/sys/class/infiniband").is_dir() and any(Path("/sys/class/infiniband").iterdir())


def _import_torchstore():
    os.environ.setdefault("TORCHSTORE_RDMA_ENABLED", "1" if _has_rdma() else "0")
    try:
        import torchstore
        from monarch.actor import endpoint, get_or_spawn_controller
        from torchstore.controller import Controller
    except ImportError as exc:
        raise ConfigError(
            f"weights.backend=torchstore needs the torchstore extra ({exc}); run `make torchstore` "
            "(pip install --no-deps torchstore==0.1.2 torchmonarch==0.6.0 + deps) or pick "
            "weights.backend=shm/dir"
        ) from exc
    return torchstore, endpoint, get_or_spawn_controller, Controller


def _async_controller_class():
    """torchstore 0.1.2's Controller with its five sync endpoints re-declared async.

    Why: torchmonarch >= 0.2 refuses an actor that mixes sync and async endpoints ("Controller
    mixes both async and sync endpoints"), so every `torchstore.initialize()` fails on the Monarch
    builds that exist for current torch. The bodies are unchanged (they only touch the actor's
    own dicts); spawning this subclass under the store's name first makes torchstore use it,
    with no edit to installed files.
    """
    _, endpoint, _, Controller = _import_torchstore()

    def wrap(name):
        sync = Controller.__dict__[name]._method

        async def method(self, *args, **kwargs):
            return sync(self, *args, **kwargs)

        method.__name__ = name
        return endpoint(method)

    names = ["get_controller_strategy", "locate_volumes", "notify_put", "keys", "notify_delete"]
    return type("AsyncController", (Controller,), {n: wrap(n) for n in names})


_READY: dict[str, asyncio.Lock] = {}


async def ensure_store(name: str = STORE_NAME) -> None:
    """Spawn (once per Monarch program) the adapted controller, then torchstore's volumes."""
    ts, _, get_or_spawn_controller, _ = _import_torchstore()
    controller = await get_or_spawn_controller(name, _async_controller_class())
    try:
        await controller.get_controller_strategy.call_one()  # raises until initialised
        return
    except Exception:
        pass
    await ts.initialize(store_name=name)


class _TorchStoreKeys:
    """What both sides share: the run's key prefix in the store and the adapted store's start."""

    transport = "torchstore"

    def _init_store(self, keys: Keys) -> None:
        self.ts = _import_torchstore()[0]
        self.prefix = f"streamrl/{keys.run}/v"
        self._ready = False

    async def _store(self) -> None:
        if not self._ready:
            await ensure_store()
            self._ready = True

    async def _version_keys(self) -> dict[int, list[str]]:
        # All keys, filtered here: torchstore 0.1.2's prefix filter misses partial path components.
        out: dict[int, list[str]] = {}
        for key in await self.ts.keys():
            head = key[len(self.prefix) :].split("/", 1)[0] if key.startswith(self.prefix) else ""
            if head.isdigit():
                out.setdefault(int(head), []).append(key)
        return out

    async def _stored_versions(self) -> list[int]:
        return sorted(await self._version_keys())


class TorchStorePublisher(_TorchStoreKeys, WeightPublisher):
    def __init__(self, broker: Broker, keys: Keys, keep: int):
        super().__init__(broker, keys, keep)
        self._init_store(keys)

    @classmethod
    def from_config(cls, cfg: Config, broker: Broker, run_dir) -> "TorchStorePublisher":
        return cls(broker, Keys.of(cfg), cfg.weights.keep)

    # torchstore's API is async, so the public methods are overridden instead of the blocking hooks.
    def _write(self, version, state_dict, adapter=""):  # pragma: no cover - not used (publish is async here)
        raise NotImplementedError

    def _collect(self, keep_versions):  # pragma: no cover
        raise NotImplementedError

    def _versions(self):  # pragma: no cover
        raise NotImplementedError

    async def publish(
        self, version: int, state_dict: dict[str, torch.Tensor], adapter: dict | None = None
    ) -> WeightHandle:
        config = adapter_json(state_dict, adapter) if adapter is not None else ""
        await self._store()
        key = f"{self.prefix}{version}"
        created = time.time()
        await self.ts.put_state_dict(state_dict, key, store_name=STORE_NAME)
        size = sum(t.numel() * t.element_size() for t in state_dict.values())
        # An adapter's config travels in the handle; the reader writes the PEFT folder from it.
        wh = WeightHandle(
            version=version, transport=self.transport, handle=key, bytes=size, created_at=created, adapter=config
        )
        await self._advance(wh)
        self.log.info("weights_published", policy_version=version, bytes=size)
        await self.gc()
        return wh

    async def gc(self) -> None:
        stored = await self._version_keys()
        versions = sorted(stored)
        keep = set(versions[-self.keep :])
        current = await self.latest()
        if current is not None:
            keep.add(current.version)
        for v in versions:
            if v not in keep:
                for key in stored[v]:
                    await self.ts.delete(key, store_name=STORE_NAME)


class TorchStoreLoader(_TorchStoreKeys, WeightLoader):
    def __init__(self, broker: Broker, keys: Keys, cache_root: Path):
        super().__init__(broker, keys)
        self._init_store(keys)
        self.cache_dir = Path(cache_root) / f"torchstore-{os.getpid()}"

    @classmethod
    def from_config(cls, cfg: Config, broker: Broker, run_dir) -> "TorchStoreLoader":
        return cls(broker, Keys.of(cfg), shm_root(cfg.run.name, run_dir))

    def _fetch(self, handle):  # pragma: no cover - not used (fetch is async here)
        raise NotImplementedError

    async def fetch(self, handle: WeightHandle) -> str:
        if handle.transport != self.transport:
            raise WeightStoreError(
                f"version {handle.version} was published with transport {handle.transport!r}; "
                f"set weights.backend={handle.transport} for every role"
            )
        dst = self.cache_dir / f"v{handle.version}"
        if all((dst / f).is_file() for f in version_files(handle.is_adapter)):
            return str(dst)
        await self._store()
        try:
            sd = await self.ts.get_state_dict(handle.handle, store_name=STORE_NAME)
        except Exception as exc:
            raise WeightStoreError(
                f"torchstore has no {handle.handle} ({exc!r}): collected before it was "
                "fetched; fetch the newest one instead, or raise weights.keep"
            ) from None
        await asyncio.to_thread(self._save_local, handle, sd, dst)
        return str(dst)

    def _save_local(self, handle: WeightHandle, sd: dict, dst: Path) -> None:
        tmp = self.cache_dir / f".tmp-v{handle.version}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        if handle.is_adapter:
            write_peft_dir(tmp, sd, handle.adapter)
        else:
            save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        shutil.rmtree(dst, ignore_errors=True)
        os.rename(tmp, dst)
        local = version_dirs(self.cache_dir)
        keep = set(sorted(v for v in local if v <= handle.version)[-self.local_copies :]) | {handle.version}
        for v, path in local.items():  # this copy and the ones before it that vLLM may still read
            if v not in keep:
                shutil.rmtree(path, ignore_errors=True)

    async def close(self) -> None:
        shutil.rmtree(self.cache_dir, ignore_errors=True)
