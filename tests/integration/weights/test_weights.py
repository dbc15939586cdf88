"""The versioned weight store against a real redis-server: shm and dir backends.

pytest tests/integration/weights/test_weights.py
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from streamrl.config.schema import Config, WeightsConfig
from streamrl.core.errors import ConfigError
from streamrl.weights.files import WEIGHTS_FILE, version_dirs
from streamrl.weights.shm import shm_root
from streamrl.weights.store import WeightHandle, WeightStoreError, make_loader, make_publisher, snapshot_state_dict

pytestmark = pytest.mark.anyio


def _state(seed: int, n: int = 64) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(n, 16, generator=g),
        "model.norm.weight": torch.randn(16, generator=g),
    }


@pytest.fixture(params=["shm", "dir"])
def store_cfg(request, config: Config, tmp_path: Path):
    cfg = config.model_copy(update={"weights": WeightsConfig(backend=request.param, keep=2)})
    yield cfg
    shutil.rmtree(shm_root(cfg.run.name, tmp_path), ignore_errors=True)


def _assert_same(path: str, expected: dict[str, torch.Tensor]) -> None:
    loaded = load_file(str(Path(path) / WEIGHTS_FILE))
    assert loaded.keys() == expected.keys()
    for k, v in expected.items():
        assert torch.equal(loaded[k], v), k


async def test_publish_latest_fetch(store_cfg: Config, broker, tmp_path: Path):
    store, loader = make_publisher(store_cfg, broker, tmp_path), make_loader(store_cfg, broker, tmp_path)
    assert await store.latest() is None and await loader.latest() is None
    sd = _state(0)
    h = await store.publish(1, snapshot_state_dict(sd))
    assert (h.version, h.transport) == (1, store_cfg.weights.backend)
    assert h.bytes == (Path(h.handle) / WEIGHTS_FILE).stat().st_size > 64 * 16 * 4
    assert await store.latest() == h == await loader.latest()  # round-trips through the broker hash
    raw = await broker.hgetall(store.keys.weights_latest)
    assert set(raw) == {"version", "transport", "handle", "bytes", "created_at", "adapter"}
    local = await loader.fetch(h)
    assert loader.reload_call(local) == ("reload_weights", {"weights_path": local})
    _assert_same(local, sd)
    if store_cfg.weights.backend == "shm":
        assert Path(h.handle).parent == shm_root(store_cfg.run.name, tmp_path)
        assert os.stat(Path(local) / WEIGHTS_FILE).st_ino == os.stat(Path(h.handle) / WEIGHTS_FILE).st_ino
    else:
        assert Path(h.handle).parent == tmp_path / "weights"  # default: RUN_DIR/weights
        assert Path(local).is_relative_to(shm_root(store_cfg.run.name, tmp_path))  # copied to local memory
    await loader.close()
    assert not Path(local).exists()


async def test_latest_only_moves_forward(store_cfg: Config, broker, tmp_path: Path):
    store = make_publisher(store_cfg, broker, tmp_path)
    await store.publish(3, _state(3))
    await store.publish(2, _state(2))  # a late, older publish must not win
    assert (await store.latest()).version == 3
    await store.publish(4, _state(4))
    assert (await store.latest()).version == 4


async def test_gc_keeps_newest_and_fetched_copies_survive(store_cfg: Config, broker, tmp_path: Path):
    store, loader = make_publisher(store_cfg, broker, tmp_path), make_loader(store_cfg, broker, tmp_path)
    h0 = await store.publish(0, _state(0))
    local0 = await loader.fetch(h0)
    for v in range(1, 5):
        await store.publish(v, _state(v))
    assert sorted(version_dirs(store.root)) == [3, 4]  # keep=2
    _assert_same(local0, _state(0))  # a generator's local copy outlives the published one
    with pytest.raises(WeightStoreError, match="collected before it was fetched"):
        await loader.fetch(WeightHandle(1, h0.transport, str(store.root / "v1"), 1, time.time()))
    await loader.close()


async def test_failed_write_leaves_nothing(store_cfg: Config, broker, tmp_path: Path):
    store = make_publisher(store_cfg, broker, tmp_path)
    await store.publish(1, _state(1))
    with pytest.raises(Exception):  # noqa: B017 (whatever safetensors raises: the point is what is left)
        await store.publish(2, {"w": "not a tensor"})  # safetensors refuses it mid-write
    assert (await store.latest()).version == 1
    assert sorted(p.name for p in store.root.iterdir() if not p.name.startswith("fetched-")) == ["v1"]


async def test_transport_mismatch_names_the_fix(config: Config, broker, tmp_path: Path):
    shm = make_loader(config.model_copy(update={"weights": WeightsConfig(backend="shm")}), broker, tmp_path)
    d = make_publisher(config.model_copy(update={"weights": WeightsConfig(backend="dir")}), broker, tmp_path)
    try:
        h = await d.publish(1, _state(1))
        with pytest.raises(WeightStoreError, match="set weights.backend=dir"):
            await shm.fetch(h)
    finally:
        shutil.rmtree(shm_root(config.run.name, tmp_path), ignore_errors=True)


async def test_publish_serialises_off_the_event_loop(config: Config, broker, tmp_path: Path):
    store = make_publisher(config.model_copy(update={"weights": WeightsConfig(backend="dir")}), broker, tmp_path)
    sd = {"big": torch.randn(8 * 1024 * 1024)}  # 32 MiB: long enough to notice a blocked loop
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1

    t = asyncio.create_task(ticker())
    try:
        await store.publish(1, sd)
    finally:
        t.cancel()
    assert ticks >= 3, "the event loop did not run while publish serialised"


async def test_gc_removes_copies_of_dead_readers(config: Config, broker, tmp_path: Path):
    cfg = config.model_copy(update={"weights": WeightsConfig(backend="shm")})
    store = make_publisher(cfg, broker, tmp_path)
    try:
        dead = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
        )
        stale = store.root / f"fetched-{int(dead.stdout)}" / "v0"
        stale.mkdir(parents=True)
        live = store.root / f"fetched-{os.getpid()}" / "v0"
        live.mkdir(parents=True)
        await store.publish(1, _state(1))
        assert not stale.parent.exists() and live.exists()
    finally:
        shutil.rmtree(shm_root(cfg.run.name, tmp_path), ignore_errors=True)


async def test_two_runs_of_one_name_keep_their_own_shm_weights(config: Config, broker, tmp_path: Path):
    """Two jobs with the same run.name on one host (different run dirs): neither overwrites, collects
    or deletes the other's versions; a reader without a run dir links next to the publisher's."""
    cfg = config.model_copy(update={"weights": WeightsConfig(backend="shm", keep=1)})
    a, b = make_publisher(cfg, broker, tmp_path / "a"), make_publisher(cfg, broker, tmp_path / "b")
    reader = make_loader(cfg, broker, None)
    try:
        ha = await a.publish(1, _state(1))
        hb = await b.publish(1, _state(2))
        assert Path(ha.handle).parent != Path(hb.handle).parent
        _assert_same(ha.handle, _state(1))  # b's version 1 did not replace a's
        await a.publish(2, _state(3))  # a's gc (keep=1) must not collect b's version
        _assert_same(hb.handle, _state(2))
        local = await reader.fetch(hb)
        assert Path(local).parent.parent == b.root
        assert os.stat(Path(local) / WEIGHTS_FILE).st_ino == os.stat(Path(hb.handle) / WEIGHTS_FILE).st_ino
        shutil.rmtree(a.root)  # what `streamrl up` does when run a ends
        _assert_same(hb.handle, _state(2))
        _assert_same(local, _state(2))
    finally:
        await reader.close()
        for store in (a, b):
            shutil.rmtree(store.root, ignore_errors=True)
        shutil.rmtree(shm_root(cfg.run.name, None), ignore_errors=True)


async def test_dir_backend_without_a_directory_names_the_fix(config: Config, broker):
    dir_cfg = config.model_copy(update={"weights": WeightsConfig(backend="dir")})
    for make in (make_publisher, make_loader):
        with pytest.raises(ConfigError, match="set weights.dir="):
            make(dir_cfg, broker, None)


def test_snapshot_is_an_independent_cpu_copy():
    base = torch.nn.Linear(4, 4)
    tied = {"a": base.weight, "b": base.weight, "bias": base.bias}
    snap = snapshot_state_dict(tied)
    with torch.no_grad():
        base.weight.add_(1.0)
    assert not torch.equal(snap["a"], base.weight)
    assert snap["a"].data_ptr() != snap["b"].data_ptr()  # tied weights become separate tensors
    assert all(not t.requires_grad and t.is_contiguous() and t.device.type == "cpu" for t in snap.values())
