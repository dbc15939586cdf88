"""reference.source=trainer (the default with trainer.lora): the trainer computes the KL term's
reference log-probs in its own step, from its own FSDP2 model with the adapter disabled, on the real
tiny Llama (gloo, CPU, world 1 and 2) with lm_head among the targets and chunked log-probs.

After the adapter has trained, those log-probs equal a plain transformers forward of the base model
(they are not the policy's); a step computing them itself equals a step handed the base model's
log-probs by a reference worker (reference.source=worker), metric for metric and in the adapter it
publishes; and the adapter-disabled forwards leave every adapter parameter trainable and published.

    pytest tests/integration/train/test_lora_reference.py
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from streamrl.config.schema import Config, GeneratorConfig, LossConfig, ModelConfig, TrainerConfig
from streamrl.config.trainer import LoraConfig
from streamrl.core.batch import Batch
from streamrl.train.batching import pad_batch
from streamrl.train.dist import broadcast_object, launch
from streamrl.train.hf_engine import HFEngine
from tests.integration.train.test_train_engine import TEMPERATURE, make_batch, reference_logprobs

LORA = LoraConfig(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj", "down_proj", "lm_head"])
STEPS = 3


def lora_kl_config(model_path: str, world: int, source: str) -> Config:
    return Config(
        model=ModelConfig(path=model_path),
        generator=GeneratorConfig(temperature=TEMPERATURE),
        loss=LossConfig(kl_beta=0.5),
        trainer=TrainerConfig(world_size=world, micro_batch_size=2, lr=5e-2, logprob_chunk_tokens=4, lora=LORA),
        reference={"source": source},
    )


def shard_rows(engine: HFEngine, batch: Batch, reference: bool) -> list[np.ndarray]:
    """This rank's rows of the trainer's reference (or policy) log-probs, unpadded."""
    shard = batch.shard(engine.rank, engine.world_size)
    padded = {k: v.to(engine.device) for k, v in pad_batch(shard, engine.pad_id).items()}
    if reference:
        logp = engine.reference_logprobs(padded)
    else:
        with torch.no_grad():
            logp, _ = engine.logprobs(padded)
    engine.model.reshard()  # a no-grad forward leaves the root's group gathered (no backward follows)
    return [logp[i, : len(r.completion_ids)].numpy().copy() for i, r in enumerate(shard.rollouts)]


def _train(engine: HFEngine, batch: Batch) -> list[dict]:
    return [engine.train_step(batch) for _ in range(STEPS)]


def _rank_main(model_path: str, batch: Batch, base_lp: list, out: str, rank: int, world: int) -> None:
    torch.set_num_threads(1)
    batch, base_lp = broadcast_object((batch, base_lp) if rank == 0 else None)
    # The trainer computes the reference itself: the batch carries none (the assembler waits for none).
    own = HFEngine(lora_kl_config(model_path, world, "auto"), model_path, rank, world)
    own_metrics = _train(own, batch)
    record = {
        "own": own_metrics,
        "ref": [r.tolist() for r in shard_rows(own, batch, reference=True)],
        "policy": [r.tolist() for r in shard_rows(own, batch, reference=False)],
        "frozen_marked_adapter": [n for n, p in own.model.named_parameters() if "lora_" in n and not p.requires_grad],
    }
    own_published = own.full_state_dict()
    # A reference worker's run: the same steps, each handed the plain base model's log-probs.
    worker = HFEngine(lora_kl_config(model_path, world, "worker"), model_path, rank, world)
    with_ref = Batch(batch.rollouts, batch.group_index, batch.rewards, batch.advantages, base_lp, batch.staleness)
    record["worker"] = _train(worker, with_ref)
    worker_published = worker.full_state_dict()
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(record))
    if rank == 0:
        torch.save({"own": own_published, "worker": worker_published}, Path(out) / "published.pt")


@pytest.fixture(scope="module")
def batch_and_base(tiny):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    base = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    b = make_batch(base.config.vocab_size)
    base_lp = [lp.astype(np.float32) for lp in reference_logprobs(base, b)]
    for r, lp in zip(b.rollouts, base_lp):
        r.logprobs = lp  # sampled by the base: the first step is on-policy
    return b, base_lp


@pytest.fixture(scope="module")
def runs(tiny, batch_and_base, tmp_path_factory) -> dict[int, Path]:
    batch, base_lp = batch_and_base
    out = {w: tmp_path_factory.mktemp(f"lora-ref-world{w}") for w in (1, 2)}
    for world in (1, 2):
        launch(world, functools.partial(_rank_main, str(tiny), batch, base_lp, str(out[world])))
    return out


def _ranks(out: Path, world: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def test_a_lora_config_resolves_to_no_reference_worker():
    cfg = lora_kl_config("unused", 1, "auto")
    assert cfg.reference_in_trainer() and cfg.reference.count == 0
    assert "ref_logprobs" not in cfg.required_annotations()


@pytest.mark.parametrize("world", [1, 2])
def test_reference_logprobs_are_the_base_models_after_training(runs, batch_and_base, world):
    _, base_lp = batch_and_base
    ranks = _ranks(runs[world], world)
    ref = [np.asarray(row) for rec in ranks for row in rec["ref"]]
    policy = [np.asarray(row) for rec in ranks for row in rec["policy"]]
    for got, expected in zip(ref, base_lp, strict=True):  # contiguous shards: rank order is batch order
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    # the adapter moved: the policy's log-probs are no longer the reference's
    assert max(np.abs(p - r).max() for p, r in zip(policy, ref)) > 1e-2
    assert ranks[0]["own"][-1]["kl"] > 1e-5  # so the KL term had something to measure


@pytest.mark.parametrize("world", [1, 2])
def test_a_step_computing_its_reference_equals_one_handed_the_base_models(runs, world):
    rec = _ranks(runs[world], world)[0]
    for own, worker in zip(rec["own"], rec["worker"], strict=True):
        for key in ("loss", "kl", "grad_norm"):
            assert own[key] == pytest.approx(worker[key], rel=1e-4, abs=1e-6), key
    published = torch.load(runs[world] / "published.pt")
    assert published["own"].keys() == published["worker"].keys()
    for key, value in published["worker"].items():
        torch.testing.assert_close(published["own"][key], value, rtol=1e-4, atol=1e-6, msg=key)


@pytest.mark.parametrize("world", [1, 2])
def test_adapter_disabled_forwards_leave_the_whole_adapter_trainable_and_published(runs, world):
    """peft's own disable_adapter() left lm_head's adapter frozen-marked under FSDP2 (its publish and
    checkpoints select by requires_grad); streamrl.train.lora.adapters_disabled must not."""
    assert all(rec["frozen_marked_adapter"] == [] for rec in _ranks(runs[world], world))
    own = torch.load(runs[world] / "published.pt")["own"]
    assert {"base_model.model.lm_head.lora_A.weight", "base_model.model.lm_head.lora_B.weight"} <= own.keys()
