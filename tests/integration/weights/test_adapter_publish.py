"""Adapter-only publish (trainer.lora): a peft adapter on the tiny model, published and fetched
through every backend, arrives byte-identical as a PEFT folder that peft loads.

    pytest tests/integration/weights/test_adapter_publish.py     # cuda_ipc's test needs a GPU (-m gpu)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from streamrl.config.schema import Config, ModelConfig, TinyModelConfig, WeightsConfig
from streamrl.models.tiny import build_tiny_model
from streamrl.weights.lora import ADAPTER_CONFIG, ADAPTER_FILE, AdapterError
from streamrl.weights.shm import shm_root
from streamrl.weights.store import WeightHandle, make_loader, make_publisher
from tests.programs.lora_adapter import adapter_payload, tiny_peft

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny_model(TinyModelConfig(), tmp_path_factory.mktemp("m") / "tiny", seed=0)


@pytest.fixture(scope="module")
def adapter(tiny_dir: Path):
    model = tiny_peft(tiny_dir, seed=1)
    state, config = adapter_payload(model)
    return model, state, config


def _cfg(config: Config, backend: str) -> Config:
    return config.model_copy(update={"weights": WeightsConfig(backend=backend, keep=2)})


def _assert_peft_dir(local: Path, state: dict[str, torch.Tensor], config: dict, model, tiny_dir: Path) -> None:
    """The folder holds exactly the published tensors, byte for byte, and peft loads it to the same model."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    assert sorted(p.name for p in local.iterdir()) == sorted([ADAPTER_FILE, ADAPTER_CONFIG])
    loaded = load_file(str(local / ADAPTER_FILE))
    assert loaded.keys() == state.keys()
    for k, v in state.items():
        assert loaded[k].dtype == v.dtype and torch.equal(loaded[k].view(torch.uint8), v.view(torch.uint8)), k
    written = json.loads((local / ADAPTER_CONFIG).read_text())
    assert (written["peft_type"], written["r"], written["lora_alpha"]) == ("LORA", config["r"], config["lora_alpha"])
    assert sorted(written["target_modules"]) == sorted(config["target_modules"])
    base = AutoModelForCausalLM.from_pretrained(tiny_dir, torch_dtype=torch.float32)
    again = PeftModel.from_pretrained(base, str(local)).eval()
    ids = torch.tensor([[1, 5, 9, 13, 40]])
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)
        with again.disable_adapter():  # and the adapter changes the model (it is not peft's no-op init)
            assert not torch.allclose(again(ids).logits, model(ids).logits)


@pytest.mark.parametrize("backend", ["shm", "dir"])
async def test_file_backends_publish_peft_layout(backend, config: Config, broker, tmp_path: Path, adapter, tiny_dir):
    model, state, peft_config = adapter
    cfg = _cfg(config, backend)
    store, loader = make_publisher(cfg, broker, tmp_path), make_loader(cfg, broker, tmp_path)
    try:
        h = await store.publish(3, state, adapter=peft_config)
        assert h.is_adapter and json.loads(h.adapter)["r"] == peft_config["r"]
        assert h.bytes == (Path(h.handle) / ADAPTER_FILE).stat().st_size
        assert sorted(p.name for p in Path(h.handle).iterdir()) == sorted([ADAPTER_FILE, ADAPTER_CONFIG])
        newest = await loader.latest()
        assert newest == h and newest.is_adapter  # the adapter mark round-trips through the broker hash
        local = Path(await loader.fetch(newest))
        assert local != Path(h.handle)
        _assert_peft_dir(local, state, peft_config, model, tiny_dir)
        full = await store.publish(4, {"model.norm.weight": torch.ones(64)})  # full weights: no mark
        assert not full.is_adapter and not (await loader.latest()).is_adapter
    finally:
        await loader.close()
        shutil.rmtree(shm_root(cfg.run.name, tmp_path), ignore_errors=True)


async def test_handles_from_before_adapters_read_as_full_weights(config: Config, broker):
    raw = {"version": b"2", "transport": b"shm", "handle": b"/x", "bytes": b"1", "created_at": b"1.0"}
    assert not WeightHandle.from_mapping(raw).is_adapter


async def test_publish_refuses_what_is_not_an_adapter(config: Config, broker, tmp_path: Path, adapter):
    _, state, peft_config = adapter
    store = make_publisher(_cfg(config, "shm"), broker, tmp_path)
    try:
        with pytest.raises(AdapterError, match="only LoRA tensors"):
            await store.publish(1, {"model.norm.weight": torch.ones(4)}, adapter=peft_config)
        with pytest.raises(AdapterError, match="peft_type 'LORA'"):
            await store.publish(1, state, adapter={**peft_config, "peft_type": "PROMPT_TUNING"})
        assert await store.latest() is None  # nothing was written or announced
    finally:
        shutil.rmtree(shm_root(config.run.name, tmp_path), ignore_errors=True)


async def test_torchstore_publishes_adapters(config: Config, broker, tmp_path: Path, adapter, tiny_dir):
    pytest.importorskip("torchstore", reason="the torchstore extra is not installed (make setup installs it)")
    model, state, peft_config = adapter
    cfg = _cfg(config, "torchstore")
    store, loader = make_publisher(cfg, broker, tmp_path), make_loader(cfg, broker, tmp_path)
    try:
        h = await store.publish(1, state, adapter=peft_config)
        assert h.is_adapter and h.bytes == sum(t.numel() * t.element_size() for t in state.values())
        _assert_peft_dir(Path(await loader.fetch(await loader.latest())), state, peft_config, model, tiny_dir)
    finally:
        await loader.close()


FETCH_IN_CHILD = r"""
import json, sys
from pathlib import Path
from streamrl.core.broker import Keys
from streamrl.weights.cuda_ipc_load import CudaIpcLoader
from streamrl.weights.store import WeightHandle
handle = WeightHandle(**json.loads(Path(sys.argv[1]).read_text()))
loader = CudaIpcLoader(None, Keys(sys.argv[2]), Path(sys.argv[3]))
local = loader._fetch(handle)
print(sorted(p.name for p in Path(local).iterdir()))  # before settle: the config alone
loader.settle(handle, local)
print(local)
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC needs a CUDA GPU")
async def test_cuda_ipc_fetch_then_settle_give_the_adapter_as_a_peft_dir(
    config: Config, broker, tmp_path, adapter, tiny_dir
):
    model, state, peft_config = adapter
    cfg = _cfg(config, "cuda_ipc").model_copy(update={"model": ModelConfig(dtype="bfloat16")})
    store = make_publisher(cfg, broker, tmp_path)
    try:
        h = await store.publish(1, state, adapter=peft_config)
        assert h.is_adapter
        (tmp_path / "handle.json").write_text(json.dumps(h.to_mapping()))
        # The repo first, what the environment already puts on the path after it (a carried site dir).
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        # Another process maps the buffer (CUDA IPC cannot be opened by the process that exported it).
        out = subprocess.run(
            [sys.executable, "-c", FETCH_IN_CHILD, str(tmp_path / "handle.json"), cfg.run.name, str(tmp_path)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        lines = out.stdout.strip().splitlines()
        assert lines[-2] == repr([ADAPTER_CONFIG])  # fetch: what the switch needs, no tensor copy yet
        # float32 stays float32 although model.dtype is bfloat16: the adapter arrives byte for byte.
        _assert_peft_dir(Path(lines[-1]), state, peft_config, model, tiny_dir)
    finally:
        await store.close()
