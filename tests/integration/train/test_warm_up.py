"""trainer.warm_up: the dummy micro-batches before the first batch leave the engine as it was, so
the first real step is the step it would have been without them, bit for bit.

    pytest tests/integration/train/test_warm_up.py

Real engines (hf and torchtitan backends, tiny Llama, 1 gloo rank on CPU): one engine warms up
then trains a step, a second one of the same seed only trains; weights, optimizer state,
schedule and the step's metrics are compared exactly.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from streamrl.config.schema import Config, GeneratorConfig, TrainerConfig
from streamrl.train.dist import launch
from streamrl.train.engines import make_engine
from tests.integration.train.test_train_engine import make_batch
from workers.trainer import warm_up


def _state(engine) -> dict:
    return {k: v.full_tensor().clone() for k, v in engine.model.state_dict().items() if hasattr(v, "full_tensor")}


def _rank_main(model_path: str, backend: str, out: str, rank: int, world: int) -> None:
    torch.set_num_threads(1)
    cfg = Config(
        generator=GeneratorConfig(max_tokens=9, max_model_len=64),
        trainer=TrainerConfig(device="cpu", backend=backend, micro_batch_size=3, lr=1e-2, warm_up=True),
    )
    results = {}
    for warm in (True, False):
        engine = make_engine(cfg, model_path, rank, world)
        before = _state(engine)
        lr = engine.scheduler.get_last_lr()
        if warm:
            warm_up(engine, cfg)  # trainer.warm_up=True: lengths (9, 8) from generator.max_tokens
            after = _state(engine)
            assert all(torch.equal(after[k], before[k]) for k in before), "the warm-up moved a weight"
            assert not engine.optimizer.state and engine.steps_done == 0 and engine.scheduler.get_last_lr() == lr
            assert all(p.grad is None for p in engine.model.parameters())
        metrics = engine.train_step(make_batch(engine.vocab_size))
        optim = {
            i: {k: v.full_tensor() if hasattr(v, "full_tensor") else v.clone() for k, v in s.items()}
            for i, s in engine.optimizer.state_dict()["state"].items()
        }
        results[warm] = {"metrics": metrics, "state": _state(engine), "optim": optim}
    torch.save(results, Path(out) / "results.pt")


@pytest.mark.parametrize("backend", ["hf", "torchtitan"])
def test_warm_up_leaves_the_first_step_unchanged(tiny, tmp_path, backend):
    launch(1, functools.partial(_rank_main, str(tiny), backend, str(tmp_path)))
    r = torch.load(tmp_path / "results.pt", weights_only=False)
    warm, cold = r[True], r[False]
    assert cold["metrics"]["grad_norm"] > 1e-3
    for key in set(cold["metrics"]) - {"time_s"}:
        assert warm["metrics"][key] == cold["metrics"][key], key
    for k, v in cold["state"].items():
        assert torch.equal(warm["state"][k], v), k
    assert cold["optim"] and list(warm["optim"]) == list(cold["optim"])
    for i, s in cold["optim"].items():
        for k, v in s.items():
            assert torch.equal(warm["optim"][i][k], v), (i, k)
