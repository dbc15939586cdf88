"""What producers send, as the trainer's assembler takes it in (real redis-server): values of the wrong
shape for their key, annotations naming no rollout, and two completions of one regenerated sample.

    pytest tests/integration/assemble/test_annotation_intake.py
"""

import asyncio
import json

import numpy as np
import pytest

from streamrl.assemble.assembler import GROUP
from streamrl.config.schema import AnnotationsConfig, ExternalAnnotation
from streamrl.core.messages import Annotation, Rollout, encode, new_rollout_id
from streamrl.core.trimming import trim_stream
from tests.integration.assemble.test_assembler import make, publish_group, rid
from tests.programs.reward_fns import misbehave
from workers.reward import RewardWorker

pytestmark = pytest.mark.anyio


async def pending(broker, stream) -> int:
    return {g["name"]: g for g in await broker.group_info(stream)}[GROUP]["pending"]


async def dead_records(broker, keys) -> list[dict]:
    return [json.loads(e.data.split(b"\n", 1)[0]) for e in await broker.read(keys.deadletter, count=10_000)]


async def test_a_vector_or_an_out_of_range_value_never_reaches_the_trainer(config, broker):
    """Issue 12.1: an 8-byte `bin` for a scalar external key crashed the trainer (float(array))."""
    cfg = config.model_copy(deep=True)
    cfg.loss.kl_beta, cfg.rollout.groups_per_step = 0.0, 1
    cfg.annotations = AnnotationsConfig(external=[ExternalAnnotation(key="judge", weight=1.0, timeout_s=30)])
    cfg, owner, asm = make(cfg, broker)
    await asm.start()
    keys = owner.keys
    await publish_group(broker, keys, "g0", [1, 0])
    bad = [
        Annotation(
            rollout_id=rid("g0", 0), key="judge", value=np.array([0.5, 0.5], np.float32), producer="judge-host-1"
        ),
        Annotation(rollout_id=rid("g0", 1), key="judge", value=1e39, producer="judge-host-2"),
        Annotation(rollout_id=rid("g0", 1), key="ref_logprobs", value=np.zeros(2, np.float32), producer="ref-0"),
    ]  # 2 values for a 3-token completion
    for a in bad:
        await broker.add(keys.annotations, encode(a))
    with pytest.raises(asyncio.TimeoutError):  # nothing usable for judge yet: the group waits
        await asyncio.wait_for(asm.next_batch(0), 1.0)
    reasons = sorted(r["reason"] for r in await dead_records(broker, keys))
    assert len(reasons) == 3, reasons
    host1, host2, ref = reasons
    assert (
        host1.startswith("annotation 'judge' from producer 'judge-host-1' for rollout 'g0:0:t0'") and "scalar" in host1
    )
    assert host2.startswith("annotation 'judge' from producer 'judge-host-2' for rollout 'g0:1:t0'")
    assert "float32 range" in host2
    assert ref.startswith("annotation 'ref_logprobs' from producer 'ref-0'") and "2 values for a completion of 3" in ref
    for i, v in enumerate([0.25, 0.75]):
        await broker.add(keys.annotations, encode(Annotation(rollout_id=rid("g0", i), key="judge", value=v)))
    batch = await asyncio.wait_for(asm.next_batch(0), 10)
    np.testing.assert_allclose(batch.rewards, [1.25, 0.75])
    await asm.commit(batch)
    assert await pending(broker, keys.annotations) == 0


async def test_annotations_for_unknown_rollout_ids_are_acked_and_counted(config, broker):
    """Issue 12.2: an annotation naming no rollout stayed pending for ever and held back trimming."""
    cfg, owner, asm = make(config, broker, rollout__groups_per_step=1, loss__kl_beta=0.0)
    await asm.start()
    keys = owner.keys
    for i in range(3):  # a group that does not exist, and a sample a real group does not have
        await broker.add(keys.annotations, encode(Annotation(rollout_id=rid("nope", i), key="reward", value=1.0)))
    await broker.add(keys.annotations, encode(Annotation(rollout_id=rid("g0", 7), key="reward", value=1.0)))
    await publish_group(broker, keys, "g0", [1, 0])
    batch = await asyncio.wait_for(asm.next_batch(0), 10)
    await asm.commit(batch)
    for _ in range(3):
        await asm.poll()
    assert await pending(broker, keys.annotations) == 0
    # No rollout `nope:*` was ever read: unknown. `g0:7` is for a group that closed: late (as any
    # annotation for a closed group, whether or not its rollout exists).
    assert asm.counters["unknown_annotations"] == 3 and asm.counters["late"] == 1


async def test_annotations_stay_trimmed_with_unknown_ids_injected(config, broker):
    """A run of 40 steps with a producer writing annotations for ids that name no rollout: the real
    assembler trains and acks, the real trimming keeps `annotations` bounded."""
    cfg, owner, asm = make(config, broker, rollout__groups_per_step=1, loss__kl_beta=0.0)
    await asm.start()
    keys = owner.keys
    added = 0
    for step in range(40):
        await publish_group(broker, keys, f"g{step}", [1, 0, 0, 1])
        junk = [
            encode(Annotation(rollout_id=rid(f"ghost{step}", i), key="reward", value=0.0, producer="junk"))
            for i in range(20)
        ]
        await broker.add_many(keys.annotations, junk)
        added += 4 + len(junk)
        batch = await asyncio.wait_for(asm.next_batch(0), 10)
        await asm.commit(batch)
        await trim_stream(broker, keys.annotations, ["trainer"])
    await asm.poll()  # the last ghosts are read after the last batch
    await asm.poll()
    await trim_stream(broker, keys.annotations, ["trainer"])
    left = await broker.stream_len(keys.annotations)
    # XTRIM MINID ~ removes whole radix-tree nodes (100 entries by default): at most one node stays.
    assert added == 960 and left <= 100, f"{left} of {added} annotations still in the stream"
    assert asm.counters["unknown_annotations"] == 40 * 20


def _copy(gid: str, sample: int, tokens: int) -> Rollout:
    return Rollout(
        rollout_id=new_rollout_id(gid, sample),
        group_id=gid,
        sample=sample,
        group_size=4,
        prompt_ids=np.array([4, 5]),
        completion_ids=np.arange(6, 6 + tokens),
        logprobs=np.full(tokens, -1.0),
        version=0,
        text="x" * tokens,
    )


async def test_a_regenerated_sample_trains_with_the_reward_of_its_own_tokens(config, broker):
    """Issue 12.3: a generator killed after publishing part of a group; the restarted one publishes
    the whole group again. The reward worker that scored the first copies died too, so the second
    copies' rewards arrive first. Every trained sample must carry the reward of its own tokens.
    (This fixes the arrival order; tests/integration/generate/test_generator_kill.py does it with a real
    SIGKILL of a vLLM generator and its EngineCore.)"""
    cfg, owner, asm = make(config, broker, rollout__groups_per_step=1, loss__kl_beta=0.0)
    cfg.reward.fn = "tests.programs.reward_fns:misbehave"
    cfg.broker.claim_idle_ms = 2000
    keys = owner.keys
    await asm.start()
    reward = RewardWorker(cfg, broker, "reward-1")
    await reward.start()
    first = [_copy("g0", s, tokens=2) for s in range(2)]  # published before the SIGKILL
    for r in first:
        await broker.add(keys.rollouts, encode(r))
    taken = await broker.read_group(keys.rollouts, "reward", "reward-killed", count=10, block_ms=None)
    assert len(taken) == 2  # delivered to a reward worker that dies before scoring them
    second = [_copy("g0", s, tokens=16) for s in range(4)]  # the restarted generator: the whole group
    for r in second:
        await broker.add(keys.rollouts, encode(r))
    assert await reward.step()  # scores the second copies
    await asyncio.sleep(2.1)
    assert await reward.step()  # takes over the dead worker's entries: the first copies' rewards come last
    batch = await asyncio.wait_for(asm.next_batch(0), 10)
    assert [r.sample for r in batch.rollouts] == [0, 1, 2, 3]
    assert [len(r.completion_ids) for r in batch.rollouts] == [2, 2, 16, 16]  # the first copy of each sample
    for r, got in zip(batch.rollouts, batch.rewards):
        assert got == pytest.approx(misbehave(r.prompt_text, r.text, r.meta)), r.rollout_id
    assert asm.counters["duplicates"] == 2 + 2  # two second copies, and their two rewards
    await asm.commit(batch)
    assert await pending(broker, keys.rollouts) == 0 and await pending(broker, keys.annotations) == 0


def test_rollout_ids_name_one_completion():
    ids = {new_rollout_id("g165", 5) for _ in range(1000)}
    assert len(ids) == 1000 and all(i.startswith("g165:5:") for i in ids)


async def test_annotations_read_before_their_rollout_are_held_then_checked(config, broker):
    """The trainer may read an annotation before its rollout: it is held, and checked against the
    rollout once that is read, so a wrong-length ref_logprobs held first does not hide a good one."""
    cfg, owner, asm = make(config, broker, rollout__groups_per_step=1, loss__kl_beta=0.1)
    await asm.start()
    keys = owner.keys
    for i in range(2):
        for value in (np.zeros(2, np.float32), np.zeros(3, np.float32)):  # 2 values: wrong, 3: right
            await broker.add(
                keys.annotations,
                encode(Annotation(rollout_id=rid("g0", i), key="ref_logprobs", value=value, producer="ref-0")),
            )
        await broker.add(keys.annotations, encode(Annotation(rollout_id=rid("g0", i), key="reward", value=float(i))))
    await asm.poll()
    assert sum(len(v) for v in asm.held.get("g0", {}).values()) == 6
    await publish_group(broker, keys, "g0", [0, 1], ref=False)  # the rollouts (and repeated rewards)
    batch = await asyncio.wait_for(asm.next_batch(0), 10)
    assert [len(x) for x in batch.ref_logprobs] == [3, 3]
    assert len(await dead_records(broker, keys)) == 2  # the two short ones
    await asm.commit(batch)
    assert await pending(broker, keys.annotations) == 0
