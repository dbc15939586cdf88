"""`torchstore` backend (optional extra): versions in a torchstore (Monarch actors; RDMA where the hosts have it).

The trainer `put_state_dict`s version v under key `streamrl/<run>/v<v>` and the broker hash names
the key; a reader `get_state_dict`s it and writes it once to local shared memory, so vLLM's
`reload_weights(weights_path=...)` loads it like the `shm` backend. Old keys are deleted by gc.

Between processes (experimental): trainer rank 0 starts the store in its own process tree and puts
its controller's reference in the broker (`weights:torchstore`); a generator started anywhere, at
any time, rebuilds a client on it (streamrl/weights/torchstore_handover.py, which lists the private
names this rests on). Each process's Monarch listener binds `weights.torchstore_addr` (TCP): set it
per host to an address the other hosts route to. Versions live as long as the trainer process.

Install (PyPI has only torchstore 0.1.2, which pins torch 2.9 and torchmonarch 0.1.2; its code
runs on torchmonarch 0.6.0, built for torch 2.13): `make setup` installs them, i.e.
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
        from monarch.actor import get_or_spawn_controller
        from torchstore import state_dict_utils

        from streamrl.weights import torchstore_handover
    except ImportError as exc:
        raise ConfigError(
            f"weights.backend=torchstore needs the torchstore extra ({exc}); run `make setup` "
            "(pip install --no-deps torchstore==0.1.2 torchmonarch==0.6.0 + deps) or pick "
            "weights.backend=shm/dir"
        ) from exc
    return torchstore, get_or_spawn_controller, state_dict_utils, torchstore_handover


async def ensure_store(name: str = STORE_NAME):
    """Spawn (once per process) the adapted controller, then torchstore's volumes; return the controller."""
    ts, get_or_spawn_controller, _, handover = _import_torchstore()
    controller = await get_or_spawn_controller(name, handover.AsyncController)
    try:
        await controller.get_controller_strategy.call_one()  # raises until initialised
        return controller
    except Exception:
        pass
    await ts.initialize(store_name=name)
    return controller


class _TorchStoreKeys:
    """What both sides share: the run's key prefix in the store and this process's Monarch listener."""

    transport = "torchstore"

    def _init_store(self, keys: Keys, addr: str, port: int) -> None:
        self.ts, _, self.sd_utils, self.handover = _import_torchstore()
        self.prefix = f"streamrl/{keys.run}/v"
        self.addr, self.port = addr, port

    def _bind(self) -> None:
        self.handover.bind_listener(self.addr, self.port)


class TorchStorePublisher(_TorchStoreKeys, WeightPublisher):
    """Trainer rank 0: starts the store in this process tree and hands its controller over through the broker."""

    def __init__(self, broker: Broker, keys: Keys, keep: int, addr: str = "127.0.0.1", port: int = 0):
        super().__init__(broker, keys, keep)
        self._init_store(keys, addr, port)
        self._ready = False

    @classmethod
    def from_config(cls, cfg: Config, broker: Broker, run_dir) -> "TorchStorePublisher":
        w = cfg.weights
        return cls(broker, Keys.of(cfg), w.keep, w.torchstore_addr, w.torchstore_port)

    # torchstore's API is async, so the public methods are overridden instead of the blocking hooks.
    def _write(self, version, state_dict, adapter=""):  # pragma: no cover - not used (publish is async here)
        raise NotImplementedError

    def _collect(self, keep_versions):  # pragma: no cover
        raise NotImplementedError

    def _versions(self):  # pragma: no cover
        raise NotImplementedError

    async def _store(self) -> None:
        if self._ready:
            return
        self._bind()
        controller = await ensure_store()
        await self.handover.announce(self.broker, self.keys, controller, self.addr, self.port)
        self.log.info("torchstore_serving", addr=self.addr, port=self.port or "free")
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
    """A generator (any process, any host): reads versions from the store the broker's reference names."""

    def __init__(self, broker: Broker, keys: Keys, cache_root: Path, addr: str = "127.0.0.1"):
        super().__init__(broker, keys)
        self._init_store(keys, addr, 0)
        self.reader = self.handover.StoreReader(broker, keys)
        self.cache_dir = Path(cache_root) / f"torchstore-{os.getpid()}"

    @classmethod
    def from_config(cls, cfg: Config, broker: Broker, run_dir) -> "TorchStoreLoader":
        return cls(broker, Keys.of(cfg), shm_root(cfg.run.name, run_dir), cfg.weights.torchstore_addr)

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
        self._bind()
        client = await self.reader.client()
        try:
            sd = await self.sd_utils.get_state_dict(client, handle.handle, None, True)
        except Exception as exc:
            raise WeightStoreError(
                f"torchstore has no {handle.handle} ({exc!r}): collected before it was "
                "fetched (or the trainer restarted); fetch the newest one instead, or raise weights.keep"
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
