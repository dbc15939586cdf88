"""The torchtitan engine's weight stream (what the cuda_ipc publisher packs): the same bytes as the
whole-state conversion (adapter.to_hf over full_state_dict, the path it replaces), converted one
parameter at a time on the trainer's device, with no copy of its own.

    pytest tests/integration/train/test_titan_publish.py

Real TitanEngine ranks on gloo/CPU: the tiny Llama (to_hf permutes q/k) and the tiny Qwen3 (tied
embeddings: the LM head is not published), on 1 rank and FSDP2 over 2 ranks, after one step.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from streamrl.config.schema import Config, TinyModelConfig, TrainerConfig
from streamrl.models.tiny import build_tiny_model
from streamrl.train.dist import launch
from streamrl.train.engines import make_engine
from streamrl.weights.cuda_ipc_publish import pack_state_dict, pack_stream
from tests.integration.train.test_train_engine import make_batch


def _views(packed) -> dict[str, torch.Tensor]:
    """Each packed tensor's bytes (the alignment gaps between them are uninitialized)."""
    return {name: view.clone().view(-1).view(torch.uint8) for name, view in packed.tensors()}


def _rank_main(model_path: str, out: str, rank: int, world: int) -> None:
    torch.set_num_threads(1)
    cfg = Config(trainer=TrainerConfig(world_size=world, device="cpu", backend="torchtitan", lr=1e-2))
    engine = make_engine(cfg, model_path, rank, world)
    engine.train_step(make_batch(engine.vocab_size))
    reference = engine.full_state_dict()  # collective: adapter.to_hf over the whole gathered state
    stream = engine.weight_stream()
    live = {p.to_local().untyped_storage().data_ptr() for p in engine.model.parameters()}
    shared = 0
    tensors = []
    for t in stream.tensors:  # collective: every rank runs it to its end
        if t is not None:
            shared += t.untyped_storage().data_ptr() in live
            tensors.append(t.clone())
    # The packed buffer a cuda_ipc publish makes (its device here: CPU), in float32 and bfloat16.
    packed = {
        dt: pack_stream(engine.weight_stream(), torch.device("cpu"), dt) for dt in (torch.float32, torch.bfloat16)
    }
    if rank != 0:
        assert reference is None and not stream.receiver and stream.layout == [] and tensors == []
        assert all(p is None for p in packed.values())
        return
    torch.save(
        {
            "reference": reference,
            "layout": stream.layout,
            "tensors": tensors,
            "shared": shared,
            "packed": {str(dt): _views(p) for dt, p in packed.items()},
            "reference_packed": {str(dt): _views(pack_state_dict(reference, torch.device("cpu"), dt)) for dt in packed},
        },
        Path(out) / "rank0.pt",
    )


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    from streamrl.models.shapes import build_random_model

    root = tmp_path_factory.mktemp("models")
    return {
        "llama": build_tiny_model(TinyModelConfig(), root / "llama", seed=0),
        "qwen3-tied": Path(build_random_model("qwen3-tiny", root / "qwen3", "float32")),
    }


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("arch", ["llama", "qwen3-tied"])
def test_titan_weight_stream_is_the_whole_state_conversion_bit_for_bit(models, tmp_path, arch, world):
    launch(world, functools.partial(_rank_main, str(models[arch]), str(tmp_path)))
    r = torch.load(tmp_path / "rank0.pt")
    ref = r["reference"]
    assert [name for name, _, _ in r["layout"]] == list(ref), "same HF names, in the same order"
    assert [(dt, shape) for _, dt, shape in r["layout"]] == [(t.dtype, list(t.shape)) for t in ref.values()]
    if arch == "qwen3-tied":
        assert "lm_head.weight" not in ref and "model.embed_tokens.weight" in ref
    for (name, _, _), got in zip(r["layout"], r["tensors"], strict=True):
        assert got.dtype == ref[name].dtype and torch.equal(got, ref[name]), name
    for dt, views in r["packed"].items():  # what the generator maps: byte for byte the same
        want = r["reference_packed"][dt]
        assert list(views) == list(want)
        for name, got in views.items():
            assert torch.equal(got, want[name]), (dt, name)
    if world == 1:
        # One rank holds the whole parameter: renamed tensors are views of it (the packing is the
        # only copy); only Llama's permuted q/k projections are new tensors.
        permuted = sum(1 for name in ref if name.endswith(("q_proj.weight", "k_proj.weight")))
        assert r["shared"] == len(ref) - (permuted if arch == "llama" else 0)
