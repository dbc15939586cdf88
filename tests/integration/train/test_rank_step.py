"""streamrl/train/rank_step.py on two real gloo ranks with the tiny Llama: rank 0 issues the orders, rank 1
follows, and both run the same collectives (train, weight snapshot, checkpoint) from the broadcast order.

    pytest tests/integration/train/test_rank_step.py
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

from streamrl.config.schema import Config, TrainerConfig
from streamrl.train.checkpoint import Checkpointer, list_checkpoints
from streamrl.train.dist import launch
from streamrl.train.hf_engine import HFEngine
from streamrl.train.rank_step import RankStep, StepOrder, follow
from streamrl.weights.store import publisher_class
from tests.integration.train.test_train_engine import make_batch


def _rank_main(model_path: str, run_dir: str, out: str, rank: int, world: int) -> None:
    torch.set_num_threads(1)
    cfg = Config(trainer=TrainerConfig(world_size=world, device="cpu", micro_batch_size=2, lr=1e-2))
    engine = HFEngine(cfg, model_path, rank, world)
    snapshot = functools.partial(publisher_class("shm").snapshot, dtype="float32")
    step = RankStep(engine, snapshot, Checkpointer(Path(run_dir), keep=2))
    if rank != 0:
        follow(step)  # returns only once rank 0 sends the stop order
        Path(out, "follower.json").write_text(json.dumps({"steps_done": engine.steps_done}))
        return
    # Rank 0 holds the only real batch: the order carries it to rank 1.
    before = step(StepOrder(0, snapshot=True)).state
    trained = step(StepOrder(1, batch=make_batch(engine.vocab_size), snapshot=True, save=True))
    again = step(StepOrder(1, snapshot=True))
    trained.pending.meta = {"note": "filled in by rank 0 after the step"}
    step.stop()
    torch.save(
        {
            "before": before,
            "after": trained.state,
            "again": again.state,
            "metrics": trained.metrics,
            "train_s": trained.train_end - trained.train_start,
            "steps_done": engine.steps_done,
        },
        Path(out, "rank0.pt"),
    )


def test_two_ranks_run_rank_0s_orders(tiny, tmp_path):
    run_dir, out = tmp_path / "run", tmp_path / "out"
    run_dir.mkdir(), out.mkdir()
    launch(2, functools.partial(_rank_main, str(tiny), str(run_dir), str(out)))
    r0 = torch.load(out / "rank0.pt")
    follower = json.loads((out / "follower.json").read_text())
    # Both ranks took the one optimizer step (rank 1 trained on the batch it received).
    assert r0["steps_done"] == follower["steps_done"] == 1
    assert r0["metrics"]["seqs"] == 6 and r0["metrics"]["skipped_step"] == 0 and r0["train_s"] > 0
    # The snapshots are full HF-named weights: changed by the step, unchanged by a snapshot-only order.
    assert set(r0["before"]) == set(r0["after"]) and "model.embed_tokens.weight" in r0["after"]
    assert any(not torch.equal(r0["before"][k], r0["after"][k]) for k in r0["after"])
    for key, value in r0["after"].items():
        assert torch.equal(r0["again"][key], value), key
    # The checkpoint was written by both ranks and published by the stop order with rank 0's meta.
    ckpt = list_checkpoints(run_dir)[1]
    assert {p.name for p in ckpt.glob("extra-rank*.pt")} == {"extra-rank0.pt", "extra-rank1.pt"}
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["version"] == 1 and meta["world_size"] == 2 and meta["note"] == "filled in by rank 0 after the step"
