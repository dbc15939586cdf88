"""Eval rounds through the real broker, feeder issuer and assembler: issued once per due version (also
across a feeder restart), never in a batch, acked once scored, outside the training accounting.

    pytest tests/integration/assemble/test_eval_collector.py -q
"""

import asyncio

import numpy as np
import pytest

from streamrl.core import accounting
from streamrl.core.messages import Annotation, Prompt, decode, encode
from streamrl.eval.rounds import EvalIssuer, pass_at_k
from tests.integration.assemble.test_assembler import make, publish_group, rollout

pytestmark = pytest.mark.anyio
ITEMS = [
    {"text": "digits:", "meta": {"answer": "7"}},
    {"text": "upper:", "meta": {"answer": "9"}},
    {"text": "never used", "meta": {}},
]


def make_prompt(item, group_id, group_size, version):
    return Prompt(
        group_id=group_id,
        prompt_ids=np.array([4, 5]),
        group_size=group_size,
        admitted_version=version,
        text=item["text"],
        meta=item["meta"],
        temperature=0.7,
    )


async def until_reported(asm):
    while not asm.evals.finished:
        await asm.poll()


async def generate_and_score(broker, keys, prompts, rewards, extra=True):
    """What generators and reward/reference workers do with eval prompts: a rollout per sample, its
    `reward`, plus a ref_logprobs annotation and a redelivered duplicate when `extra`."""
    for p, row in zip(prompts, rewards):
        for s, value in enumerate(row):
            r = rollout(p.group_id, s, version=p.admitted_version, n=p.group_size)
            r.text = str(s % 2)
            await broker.add(keys.rollouts, encode(r))
            await broker.add(keys.annotations, encode(Annotation(rollout_id=r.rollout_id, key="reward", value=value)))
            if extra:
                await broker.add(
                    keys.annotations,
                    encode(Annotation(rollout_id=r.rollout_id, key="ref_logprobs", value=np.zeros(3, np.float32))),
                )
        if extra:
            await broker.add(keys.rollouts, encode(rollout(p.group_id, 0, version=p.admitted_version, n=p.group_size)))


async def test_eval_round_is_scored_outside_training(config, broker):
    cfg, owner, asm = make(config, broker, rollout__groups_per_step=1, loss__kl_beta=0.1)
    cfg.eval.every_steps, cfg.eval.samples, cfg.eval.num_prompts, cfg.eval.pass_k = 2, 3, 2, [1, 2]
    cfg.trainer.steps = 10
    keys = owner.keys
    await asm.start()

    issuer = EvalIssuer(cfg, keys, ITEMS, make_prompt)
    assert await issuer.maybe_issue(broker, 0) == 2
    restarted = EvalIssuer(cfg, keys, ITEMS, make_prompt)  # a feeder restart reads the issued mark
    assert await restarted.maybe_issue(broker, 0) == 0 and await restarted.maybe_issue(broker, 1) == 0
    prompts = [decode(e.data) for e in await broker.read(keys.prompts)]
    assert [p.group_id for p in prompts] == ["eval-0-2-0", "eval-0-2-1"]
    assert all(p.group_size == 3 and p.temperature == 0.7 and p.admitted_version == 0 for p in prompts)
    assert await broker.get(keys.feeder_admitted) is None  # not admitted: no training slot used

    await publish_group(broker, keys, "g0", [1, 0], ref=True)
    await generate_and_score(broker, keys, prompts, [[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    batch = await asyncio.wait_for(asm.next_batch(0), 10)
    assert batch.group_ids == ["g0"] and all(r.group_id == "g0" for r in batch.rollouts)
    await asyncio.wait_for(until_reported(asm), 10)
    m = asm.evals.take()
    assert m["eval/step"] == 0 and m["eval/prompts"] == 2
    assert m["eval/pass@1"] == pytest.approx(1 / 6) and m["eval/pass@2"] == pytest.approx(pass_at_k(3, 1, 2) / 2)
    assert m["eval/pass@3"] == pytest.approx(0.5) and m["eval/mean@3"] == pytest.approx(1 / 6)
    assert m["eval/maj@3"] == 0.0  # prompt 0 votes "0" (samples 0 and 2): sample 0 right, sample 2 wrong
    assert asm.evals.take() == {}
    # Eval entries are acked now; the training group's wait for its step's commit.
    rollouts = {g["name"]: g for g in await broker.group_info(keys.rollouts)}["trainer"]
    annotations = {g["name"]: g for g in await broker.group_info(keys.annotations)}["trainer"]
    assert rollouts["pending"] == 2 and annotations["pending"] == 4

    # Late redeliveries of a reported round are acked and ignored; the next round is due at version 2.
    await generate_and_score(broker, keys, prompts[:1], [[1.0, 1.0, 1.0]], extra=False)
    await asm.poll()
    assert not asm.evals.finished and not asm.evals.rounds
    assert await restarted.maybe_issue(broker, 2) == 2

    # An eval prompt a generator rejects closes nothing in the ledger and frees no admission slot.
    assert not await accounting.close_group(broker, keys, "eval-2-2-0", "failed")
    assert await broker.get(keys.trainer_released) is None

    await asm.commit(batch)
    await broker.set(keys.feeder_admitted, 1)
    await accounting.log_step(broker, keys, 1, ["g0"], [r.rollout_id for r in batch.rollouts])
    await broker.set(accounting.LedgerKeys(keys).checkpointed, 1)
    summary = accounting.summarize(cfg.broker.url, cfg.run.name)
    assert summary["invariant_holds"] and summary["admitted"] == summary["trained"] == 1
    assert summary["unknown_outcomes"] == 0


async def test_an_unfinished_older_round_is_dropped_when_a_newer_one_completes(config, broker):
    cfg, owner, asm = make(config, broker, loss__kl_beta=0.0)
    cfg.eval.every_steps, cfg.eval.samples, cfg.eval.num_prompts = 1, 2, 1
    cfg.trainer.steps = 10
    await asm.start()
    issuer = EvalIssuer(cfg, owner.keys, ITEMS, make_prompt)
    await issuer.maybe_issue(broker, 0)
    await issuer.maybe_issue(broker, 1)
    p0, p1 = [decode(e.data) for e in await broker.read(owner.keys.prompts)]
    await generate_and_score(broker, owner.keys, [p0], [[1.0]], extra=False)  # only one of its two samples
    await generate_and_score(broker, owner.keys, [p1], [[1.0, 0.0]], extra=False)
    await asyncio.wait_for(until_reported(asm), 10)
    m = asm.evals.take()
    assert m["eval/step"] == 1 and m["eval/rounds_abandoned"] == 1 and m["eval/pass@1"] == 0.5
    for stream in (owner.keys.rollouts, owner.keys.annotations):
        assert {g["name"]: g for g in await broker.group_info(stream)}["trainer"]["pending"] == 0


def test_a_prompt_temperature_overrides_the_generators():
    pytest.importorskip("vllm")
    from streamrl.config.schema import GeneratorConfig
    from streamrl.generate.vllm_engine import VLLMEngine

    engine = VLLMEngine("unused", GeneratorConfig(temperature=1.0), "float32", seed=0)  # not started: params only
    assert engine.sampling_params(7).temperature == 1.0
    assert engine.sampling_params(7, 0.0).temperature == 0.0 and engine.sampling_params(7, 0.6).temperature == 0.6
    with pytest.raises(Exception, match="temperature must be null or a number >= 0"):
        decode(
            encode(
                Prompt(
                    group_id="eval-0-1-0", prompt_ids=np.array([4]), group_size=2, admitted_version=0, temperature=-1.0
                )
            )
        )
