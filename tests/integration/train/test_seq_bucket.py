"""trainer.seq_bucket: micro-batches whose longest row differs by a few tokens share one padded shape,
so torch.compile (torchtitan backend) compiles its static graph once instead of recompiling on the
second length into a dynamic-shape graph; the padding changes no log-prob, loss or gradient.

    pytest tests/integration/train/test_seq_bucket.py

Real engines on one gloo rank (CPU, float32): the torchtitan backend with compile on the tiny Qwen3
shape (streamrl.models.shapes, inductor's C++ backend), and both backends without compile for the parity.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
import torch

from streamrl.config.schema import Config, GeneratorConfig, ParallelismConfig, TrainerConfig
from streamrl.core.batch import Batch
from streamrl.models.shapes import build_random_model
from streamrl.train.dist import launch
from streamrl.train.engines import make_engine
from tests.integration.train.shaped_batch import assert_same_step, shaped_batch
from workers.trainer import warm_up

pytestmark = pytest.mark.timeout(300)

PROMPT_LENS = (5, 7, 6, 9)  # one step each: longest rows of 21..25 tokens, all in one 32-token bucket


def ragged_batch(vocab: int, prompt_len: int, seed: int, rows: int = 4) -> Batch:
    """Rows of prompt_len - i prompt and 16 - 3 * i completion tokens: ragged within the batch, and
    the longest row (prompt_len + 16) changes with prompt_len from step to step."""
    shapes = [(max(1, prompt_len - i), 16 - 3 * i) for i in range(rows)]
    return shaped_batch(vocab, shapes, seed, advantages=np.array([1, -1] * (rows // 2), np.float32))


@pytest.fixture(scope="module")
def qwen3_tiny(tmp_path_factory) -> Path:
    return build_random_model("qwen3-tiny", tmp_path_factory.mktemp("shape") / "qwen3-tiny", "float32")


def _graphs_per_step(
    model_path: str, seq_bucket: int | None, out: dict, rank: int, world: int, warm: bool = False
) -> None:
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch.set_num_threads(1)
    torch._dynamo.reset()  # compiled graphs and counters of earlier tests in this process
    counters.clear()
    cfg = Config(
        generator=GeneratorConfig(max_tokens=16, max_model_len=64),
        trainer=TrainerConfig(
            device="cpu",
            backend="torchtitan",
            micro_batch_size=4,
            seq_bucket=seq_bucket,
            warm_up=warm,
            parallelism=ParallelismConfig(compile=True),
        ),
    )
    engine = make_engine(cfg, model_path, rank, world)
    warm_up(engine, cfg)  # trainer.warm_up=False: nothing
    out["warm_graphs"] = counters["stats"]["unique_graphs"]
    out["graphs"] = []
    out["padded"] = []
    for step, prompt_len in enumerate(PROMPT_LENS):
        m = engine.train_step(ragged_batch(engine.vocab_size, prompt_len, seed=step))
        assert np.isfinite(m["loss"]) and m["skipped_step"] == 0
        out["graphs"].append(counters["stats"]["unique_graphs"])
        out["padded"].append(m["padded_tokens"])
    torch._dynamo.reset()


def test_varying_lengths_compile_once(qwen3_tiny):
    out: dict = {}
    launch(1, functools.partial(_graphs_per_step, str(qwen3_tiny), None, out))  # default: on with compile
    assert out["graphs"][0] >= 1
    assert out["graphs"] == [out["graphs"][0]] * len(PROMPT_LENS), f"recompiled: graphs after each step {out}"
    assert out["padded"] == [4 * 32.0] * len(PROMPT_LENS)  # 4 rows padded to the 32-token bucket


def test_warm_up_compiles_the_one_static_graph_the_steps_use(qwen3_tiny):
    """The start-up warm-up (generator.max_tokens=16: one prompt token + 16 completion tokens, the
    32-token bucket) compiles the static graph the steps of 5-9 + 4..16-token rows then reuse; without
    the bucket it compiled two lengths on purpose, leaving the steps on the dynamic-shape graph."""
    out: dict = {}
    launch(1, functools.partial(_graphs_per_step, str(qwen3_tiny), None, out, warm=True))
    assert out["warm_graphs"] == 1, out
    assert out["graphs"] == [1] * len(PROMPT_LENS), out


def _grads(model_path: str, backend: str, seq_bucket: int, out: dict, rank: int, world: int) -> None:
    torch.set_num_threads(1)
    cfg = Config(trainer=TrainerConfig(device="cpu", backend=backend, micro_batch_size=2, seq_bucket=seq_bucket))
    engine = make_engine(cfg, model_path, rank, world)
    metrics = engine.train_step(ragged_batch(engine.vocab_size, 7, seed=3))
    # After the step .grad still holds this batch's (clipped) gradient; the weights moved by it.
    out["grads"] = {n: p.grad.full_tensor().clone() for n, p in engine.model.named_parameters()}
    out["metrics"] = metrics


@pytest.mark.parametrize("backend", ["hf", "torchtitan"])
def test_bucket_padding_changes_no_loss_or_gradient(qwen3_tiny, backend):
    plain, bucketed = {}, {}
    launch(1, functools.partial(_grads, str(qwen3_tiny), backend, 1, plain))
    launch(1, functools.partial(_grads, str(qwen3_tiny), backend, 16, bucketed))
    # Micro-batches of 2 rows (23 + 19 and 15 + 11 tokens): longest 23 and 15, padded to 32 and 16.
    assert plain["metrics"]["padded_tokens"] == 2 * 23 + 2 * 15
    assert bucketed["metrics"]["padded_tokens"] == 2 * 32 + 2 * 16
    assert_same_step(plain, bucketed, rtol=1e-5, atol=1e-7)
