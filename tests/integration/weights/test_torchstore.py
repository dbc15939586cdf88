"""The `torchstore` weight store (optional extra) against a real redis-server and real Monarch actors.

The extra is installed by `make setup` (Makefile: torchstore 0.1.2 + torchmonarch 0.6.0, --no-deps).
These tests skip ONLY when `torchstore` cannot be imported (a venv made without the Makefile).

    pytest tests/integration/weights/test_torchstore.py
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from streamrl.config.schema import Config, WeightsConfig
from streamrl.weights.store import WeightHandle, WeightStoreError, make_loader, make_publisher

pytest.importorskip("torchstore", reason="the torchstore extra is not installed (make setup installs it)")
pytestmark = pytest.mark.anyio


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(64, 16, generator=g),
        "model.norm.weight": torch.randn(16, generator=g),
    }


async def test_torchstore_publish_fetch_gc(config: Config, broker, tmp_path: Path):
    import json
    import os

    import torchstore as ts

    from streamrl.core.logs import setup_logging

    log = setup_logging("trainer", "trainer-0", tmp_path / "run")
    cfg = config.model_copy(update={"weights": WeightsConfig(backend="torchstore", keep=2)})
    store, loader = make_publisher(cfg, broker, tmp_path), make_loader(cfg, broker, tmp_path)
    assert os.environ["TORCHSTORE_RDMA_ENABLED"] in ("0", "1")  # decided from /sys/class/infiniband
    h1 = await store.publish(1, _state(1))
    assert (h1.transport, (await store.latest()).version) == ("torchstore", 1)
    local = await loader.fetch(h1)
    loaded = load_file(str(Path(local) / "model.safetensors"))  # what vLLM's reload_weights reads
    assert all(torch.equal(loaded[k], v) for k, v in _state(1).items())
    assert loader.reload_call(local) == ("reload_weights", {"weights_path": local})

    for v in (2, 3, 4):
        await store.publish(v, _state(v))
    assert await store._stored_versions() == [3, 4]  # keep=2; version 1's keys deleted from the store
    assert (await store.latest()).version == 4
    with pytest.raises(WeightStoreError, match="collected before it was fetched"):
        await loader.fetch(WeightHandle(2, "torchstore", h1.handle.replace("v1", "v2"), 1))
    got = await ts.get_state_dict(f"{store.prefix}4")
    assert all(torch.equal(got[k], v) for k, v in _state(4).items())
    await store.close()
    await loader.close()
    assert not Path(local).exists()
    # The role's JSON log still takes structlog's events once Monarch runs in the process.
    log.info("after_monarch", n=1)
    events = [json.loads(line)["event"] for line in (tmp_path / "run" / "logs" / "trainer-0.jsonl").open()]
    assert "torchstore_serving" in events and "after_monarch" in events
