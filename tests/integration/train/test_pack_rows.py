"""trainer.pack_rows (torchtitan backend): rollouts packed back to back into rows of a token budget with
document-masked attention give the log-probs, loss and gradients of right-padded rows.

    pytest tests/integration/train/test_pack_rows.py

Real TitanEngines on one gloo rank (CPU, float32, the tiny Qwen3 shape of streamrl.models.shapes): one trains
on padded rows, one on packed rows (budget 16: seven rollouts of 7-22 tokens become four rows, one of
them a rollout longer than the budget), same weights and batch. Tolerance: the packed forward's SDPA
takes a dense block-diagonal mask where the padded one is plain causal (other CPU kernels), so values
agree to float32 rounding, not bit for bit.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from streamrl.config.schema import Config, TrainerConfig
from streamrl.core.batch import Batch
from streamrl.models.shapes import build_random_model
from streamrl.train.dist import launch
from streamrl.train.engines import make_engine
from streamrl.train.row_packing import pack_rows, plan_rows
from tests.integration.train.shaped_batch import assert_same_step, shaped_batch

SHAPES = [(3, 5), (6, 2), (2, 7), (4, 4), (5, 3), (1, 6), (10, 12)]  # (prompt, completion) tokens
BUDGET = 16


def make_batch(vocab: int) -> Batch:
    return shaped_batch(vocab, SHAPES, seed=7)


@pytest.fixture(scope="module")
def qwen3_tiny(tmp_path_factory) -> Path:
    return build_random_model("qwen3-tiny", tmp_path_factory.mktemp("shape") / "qwen3-tiny", "float32")


def _run(model_path: str, pack: int, chunk: int, out: dict, rank: int, world: int) -> None:
    torch.set_num_threads(1)
    cfg = Config(
        trainer=TrainerConfig(
            device="cpu", backend="torchtitan", micro_batch_size=8, pack_rows=pack, logprob_chunk_tokens=chunk
        )
    )
    engine = make_engine(cfg, model_path, rank, world)
    batch = make_batch(engine.vocab_size)
    inputs = {k: v.to(engine.device) for k, v in engine.model_inputs(batch).items()}
    with torch.no_grad():
        logp, ent = engine.logprobs(inputs, with_entropy="metric")
    out["logp"] = [logp[i, : len(r.completion_ids)].clone() for i, r in enumerate(batch.rollouts)]
    out["entropy"] = [ent[i, : len(r.completion_ids)].clone() for i, r in enumerate(batch.rollouts)]
    out["rows"] = tuple(inputs.get("packed_ids", inputs["input_ids"]).shape)
    out["metrics"] = engine.train_step(batch)
    # After the step .grad still holds this batch's (clipped) gradient.
    out["grads"] = {n: p.grad.full_tensor().clone() for n, p in engine.model.named_parameters()}


@pytest.mark.parametrize("chunk", [4, 0])
def test_packed_rows_match_padded_rows(qwen3_tiny, chunk):
    padded, packed = {}, {}
    launch(1, functools.partial(_run, str(qwen3_tiny), 0, chunk, padded))
    launch(1, functools.partial(_run, str(qwen3_tiny), BUDGET, chunk, packed))
    assert padded["rows"] == (7, 22)
    assert packed["rows"] == (4, 22)  # the 22-token rollout alone sets the width
    assert packed["metrics"]["padded_tokens"] == 4 * 22 < padded["metrics"]["padded_tokens"] == 7 * 22
    for a, b in zip(padded["logp"], packed["logp"]):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)
    for a, b in zip(padded["entropy"], packed["entropy"]):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)
    assert_same_step(padded, packed, rtol=1e-4, atol=1e-6)


def test_pack_plan_and_layout():
    lengths = [8, 8, 9, 8, 8, 7, 22]
    bins = plan_rows(lengths, BUDGET)
    assert sorted(i for b in bins for i in b) == list(range(7))
    assert all(sum(lengths[i] for i in b) <= BUDGET for b in bins if len(b) > 1)
    assert bins == [[6], [2, 5], [0, 1], [3, 4]]  # longest first, first fit
    ids = torch.zeros((7, 22), dtype=torch.long)
    mask = torch.zeros((7, 22), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.arange(100 * i, 100 * i + n)
        mask[i, :n] = 1
    p = pack_rows(mask, ids, BUDGET, pad_id=-1, multiple=8)
    assert p["packed_ids"].shape == (4, 24)  # the widest row (22) rounded up to a multiple of 8
    flat = p["packed_ids"].reshape(-1)
    for i, n in enumerate(lengths):  # every real token comes back to its padded place
        assert torch.equal(flat[p["unpack_index"][i, :n]], ids[i, :n])
    pos = p["packed_positions"]
    assert int((pos == 0).sum()) == 7 + int((p["packed_ids"] == -1).sum())  # a reset per rollout and pad token


def test_pack_rows_needs_the_torchtitan_backend():
    with pytest.raises(ValueError, match="pack_rows needs trainer.backend=torchtitan"):
        TrainerConfig(backend="hf", pack_rows=1024)
