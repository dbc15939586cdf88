"""The `cuda_ipc` weight store: packing (CPU), and on a GPU a real cross-process CUDA IPC round trip + gc.

pytest tests/integration/weights/test_cuda_ipc.py            # the GPU tests skip without CUDA
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from streamrl.config.schema import Config, ModelConfig, WeightsConfig
from streamrl.weights.cuda_ipc import ALIGN, PackedState, decode_spec
from streamrl.weights.cuda_ipc_publish import pack_state_dict, pack_stream
from streamrl.weights.store import module_weight_stream

REPO = Path(__file__).resolve().parents[3]
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC needs a CUDA GPU")

READER = r"""
import hashlib, json, sys, torch
from streamrl.weights.cuda_ipc import decode_spec, open_spec
packed = open_spec(decode_spec(open(sys.argv[1]).read()))
digest = lambda t: hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes()).hexdigest()
print(json.dumps({name: [str(t.dtype), list(t.shape), digest(t)] for name, t in packed.tensors()}))
"""


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(100, 32, generator=g),
        "model.layers.0.mlp.up_proj.weight": torch.randn(48, 32, generator=g),
        "model.norm.weight": torch.randn(31, generator=g),
        "step": torch.tensor([seed], dtype=torch.int64),
    }


def test_pack_state_dict_views_are_aligned_copies():
    sd = _state(0)
    packed = pack_state_dict(sd, torch.device("cpu"), dtype=torch.bfloat16)
    views = dict(packed.tensors())
    assert list(views) == list(sd)
    for name, t in sd.items():
        want = t.to(torch.bfloat16) if t.is_floating_point() else t  # ints keep their dtype
        assert views[name].dtype == want.dtype and torch.equal(views[name], want), name
    assert all(off % ALIGN == 0 for _, _, _, off in packed.entries)
    sd["model.norm.weight"].add_(1)  # a copy, not a view of the trainer's tensors
    assert not torch.equal(views["model.norm.weight"], sd["model.norm.weight"].to(torch.bfloat16))


def test_packed_weight_stream_dedups_tied_weights():
    m = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    m[1].weight = m[0].weight  # tied, as Qwen3's lm_head / embed_tokens
    packed = pack_stream(module_weight_stream(m, receiver=True), torch.device("cpu"), torch.float32)
    assert [e[0] for e in packed.entries] == ["0.weight"]
    assert torch.equal(dict(packed.tensors())["0.weight"], m[0].weight)
    # only the receiver (rank 0) keeps it; the others still run the stream (its gathers are collective)
    assert pack_stream(module_weight_stream(m, receiver=False), torch.device("cpu"), torch.float32) is None


@gpu
@pytest.mark.gpu
@pytest.mark.anyio
async def test_cuda_ipc_round_trip_in_another_process_and_gc(config: Config, broker, tmp_path: Path):
    from streamrl.weights.store import make_loader, make_publisher

    cfg = config.model_copy(
        update={"weights": WeightsConfig(backend="cuda_ipc", keep=2), "model": ModelConfig(dtype="bfloat16")}
    )
    store, loader = make_publisher(cfg, broker, tmp_path), make_loader(cfg, broker, tmp_path)
    handles = [await store.publish(v, _state(v)) for v in range(1, 5)]
    assert sorted(store._held) == [3, 4]  # keep=2: older GPU copies released
    latest = await store.latest()
    assert latest.version == 4 and latest.transport == "cuda_ipc"
    assert loader.reload_call(await loader.fetch(latest)) == ("streamrl_reload_ipc", {"spec": latest.handle})
    assert len(decode_spec(latest.handle)["entries"]) == 4

    spec_file = tmp_path / "spec"
    spec_file.write_text(latest.handle)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run(
        [sys.executable, "-c", READER, str(spec_file)], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    for name, t in _state(4).items():
        want = t.to(torch.bfloat16) if t.is_floating_point() else t
        dtype, shape, digest = seen[name]
        assert dtype == str(want.dtype) and shape == list(want.shape)
        assert digest == hashlib.sha256(want.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest(), (
            name
        )
    assert isinstance(store._held[4], PackedState) and handles[-1].bytes == store._held[4].buffer.numel()
    await store.close()
