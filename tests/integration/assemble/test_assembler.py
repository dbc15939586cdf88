"""The assembler against a real redis-server: joins, staleness, idempotency, failures, acks."""

import asyncio

import numpy as np
import pytest

from streamrl.assemble.assembler import GROUP, Assembler
from streamrl.core.messages import Annotation, Prompt, Rollout, decode, encode
from streamrl.core.worker import Worker

pytestmark = pytest.mark.anyio


class Owner(Worker):
    role = "trainer"


def rid(gid: str, sample: int) -> str:
    """A fixed well-formed rollout id (a generator mints a random nonce: streamrl.core.messages.new_rollout_id)."""
    return f"{gid}:{sample}:t0"


def rollout(gid: str, sample: int, version: int = 0, n: int = 4, switches=None) -> Rollout:
    return Rollout(
        rollout_id=rid(gid, sample),
        group_id=gid,
        sample=sample,
        group_size=n,
        prompt_ids=np.array([4, 5]),
        completion_ids=np.array([6, 7, 8]),
        logprobs=np.array([-1.0, -2.0, -3.0]),
        version=version,
        version_switches=switches or [],
        prompt_text="ab",
        text="xyz",
    )


async def publish_group(broker, keys, gid, rewards, version=0, ref=False, n=None):
    n = n or len(rewards)
    for i, r in enumerate(rewards):
        await broker.add(keys.rollouts, encode(rollout(gid, i, version, n)))
        await broker.add(keys.annotations, encode(Annotation(rollout_id=rid(gid, i), key="reward", value=float(r))))
        if ref:
            await broker.add(
                keys.annotations,
                encode(
                    Annotation(
                        rollout_id=rid(gid, i), key="ref_logprobs", value=np.array([-1.0, -1.0, -1.0], np.float32)
                    )
                ),
            )


def make(config, broker, **changes):
    cfg = config.model_copy(deep=True)
    for dotted, value in changes.items():
        section, field = dotted.split("__")
        setattr(getattr(cfg, section), field, value)
    owner = Owner(cfg, broker, "trainer-0")
    return cfg, owner, Assembler(cfg, broker, owner.log, owner.count)


async def test_joins_complete_groups_with_advantages(config, broker):
    cfg, owner, asm = make(config, broker, rollout__groups_per_step=2, loss__kl_beta=0.0)
    await asm.start()
    await publish_group(broker, owner.keys, "g0", [1, 0, 0, 1])
    await publish_group(broker, owner.keys, "g1", [0.5, 0.5, 0.5, 0.5])
    batch = await asyncio.wait_for(asm.next_batch(0), 10)
    assert batch.group_ids == ["g0", "g1"] and len(batch) == 8
    np.testing.assert_allclose(batch.rewards, [1, 0, 0, 1, 0.5, 0.5, 0.5, 0.5])
    assert batch.advantages[0] > 0 > batch.advantages[1]
    np.testing.assert_allclose(batch.advantages[4:], 0.0, atol=1e-6)
    assert [r.sample for r in batch.rollouts[:4]] == [0, 1, 2, 3]
    info = {g["name"]: g for g in await broker.group_info(owner.keys.rollouts)}
    assert info[GROUP]["pending"] == 8  # not acked before the step
    await asm.commit(batch)
    info = {g["name"]: g for g in await broker.group_info(owner.keys.rollouts)}
    assert info[GROUP]["pending"] == 0
    info = {g["name"]: g for g in await broker.group_info(owner.keys.annotations)}
    assert info[GROUP]["pending"] == 0


async def test_waits_for_required_annotations(config, broker):
    cfg, owner, asm = make(config, broker, rollout__groups_per_step=1, loss__kl_beta=0.1)
    await asm.start()
    await publish_group(broker, owner.keys, "g0", [1, 0], ref=False)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(asm.next_batch(0), 1.0)
    for i in range(2):
        await broker.add(
            owner.keys.annotations,
            encode(Annotation(rollout_id=rid("g0", i), key="ref_logprobs", value=np.zeros(3, np.float32))),
        )
    batch = await asyncio.wait_for(asm.next_batch(0), 10)
    assert batch.ref_logprobs is not None and len(batch.ref_logprobs) == 2


async def test_stale_groups_dropped_and_released(config, broker):
    cfg, owner, asm = make(config, broker, rollout__groups_per_step=1, rollout__max_staleness=1, loss__kl_beta=0.0)
    await asm.start()
    await publish_group(broker, owner.keys, "old", [1, 0], version=1)
    await publish_group(broker, owner.keys, "new", [1, 0], version=3)
    batch = await asyncio.wait_for(asm.next_batch(4), 10)
    assert batch.group_ids == ["new"] and batch.staleness.max() == 1
    assert asm.counters["dropped_stale"] == 1
    assert int(await broker.get(owner.keys.trainer_released)) == 1


async def test_a_group_that_finished_late_is_taken_before_fresher_ones(config, broker):
    # Issue 28: "old" (oldest token v1) completed after two fresher groups (v2). At version 2 it can
    # still be trained, at version 3 it is stale (bound 1). Arrival order took the two fresh groups
    # and dropped "old" at the next step; earliest deadline first trains all three.
    cfg, owner, asm = make(config, broker, rollout__groups_per_step=2, rollout__max_staleness=1, loss__kl_beta=0.0)
    await asm.start()
    await publish_group(broker, owner.keys, "new1", [1, 0], version=2)
    await publish_group(broker, owner.keys, "new2", [1, 0], version=2)
    await publish_group(broker, owner.keys, "old", [1, 0], version=1)
    while len(asm.ready) < 3:  # all three ready before the batch forms, in arrival order new1, new2, old
        await asyncio.wait_for(asm.advance(), 10)
    assert asm.ready == ["new1", "new2", "old"]
    first = await asyncio.wait_for(asm.next_batch(2), 10)
    assert first.group_ids == ["old", "new1"] and first.staleness.max() == 1
    await asm.commit(first)
    await publish_group(broker, owner.keys, "new3", [1, 0], version=3)
    second = await asyncio.wait_for(asm.next_batch(3), 10)
    assert second.group_ids == ["new2", "new3"] and second.staleness.max() == 1
    assert asm.counters["dropped_stale"] == 0
    assert await broker.get(owner.keys.trainer_released) is None  # no slot freed: nothing was dropped


async def test_version_switch_counts_oldest_version(config, broker):
    cfg, owner, asm = make(config, broker, rollout__groups_per_step=1, rollout__max_staleness=1, loss__kl_beta=0.0)
    await asm.start()
    keys = owner.keys
    await broker.add(keys.rollouts, encode(rollout("g", 0, version=1, n=2, switches=[[2, 3]])))
    await broker.add(keys.rollouts, encode(rollout("g", 1, version=3, n=2)))
    for i in range(2):
        await broker.add(keys.annotations, encode(Annotation(rollout_id=rid("g", i), key="reward", value=float(i))))
    with pytest.raises(asyncio.TimeoutError):  # oldest token is v1: stale at v3 with bound 1
        await asyncio.wait_for(asm.next_batch(3), 1.0)
    assert asm.counters["dropped_stale"] == 1


async def test_requeue_policy_republishes_prompt(config, broker):
    cfg, owner, asm = make(
        config,
        broker,
        rollout__groups_per_step=1,
        rollout__max_staleness=0,
        rollout__stale_policy="requeue",
        loss__kl_beta=0.0,
    )
    await asm.start()
    await publish_group(broker, owner.keys, "g0", [1, 0], version=0)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(asm.next_batch(2), 1.0)
    entries = await broker.read(owner.keys.prompts)
    prompt = decode(entries[0].data)
    assert isinstance(prompt, Prompt) and prompt.group_id.startswith("g0r") and prompt.text == "ab"
    assert asm.counters["requeued"] == 1 and await broker.get(owner.keys.trainer_released) is None


async def test_duplicates_and_late_entries_are_acked_once(config, broker):
    cfg, owner, asm = make(config, broker, rollout__groups_per_step=1, loss__kl_beta=0.0)
    await asm.start()
    await publish_group(broker, owner.keys, "g0", [1, 0])
    await publish_group(broker, owner.keys, "g0", [1, 0])  # a redelivery of the whole group
    batch = await asyncio.wait_for(asm.next_batch(0), 10)
    assert len(batch) == 2 and asm.counters["duplicates"] >= 2
    await asm.commit(batch)
    await publish_group(broker, owner.keys, "g0", [1, 0])  # late, after training
    await asm.poll()
    await asm.poll()
    assert asm.counters["late"] >= 2
    for stream in (owner.keys.rollouts, owner.keys.annotations):
        info = {g["name"]: g for g in await broker.group_info(stream)}
        assert info[GROUP]["pending"] == 0


async def test_failed_annotation_drops_group(config, broker):
    cfg, owner, asm = make(config, broker, rollout__groups_per_step=1, loss__kl_beta=0.0)
    await asm.start()
    keys = owner.keys
    await broker.add(keys.rollouts, encode(rollout("bad", 0, n=1)))
    await broker.add(
        keys.annotations,
        encode(
            Annotation(rollout_id=rid("bad", 0), key="reward", value=0.0, error="reward function raised ValueError")
        ),
    )
    await publish_group(broker, keys, "good", [1, 0])
    batch = await asyncio.wait_for(asm.next_batch(0), 10)
    assert batch.group_ids == ["good"] and asm.counters["failed"] == 1
    assert int(await broker.get(keys.trainer_released)) == 1


async def test_malformed_entries_go_to_deadletter(config, broker):
    cfg, owner, asm = make(config, broker, rollout__groups_per_step=1, loss__kl_beta=0.0)
    await asm.start()
    await broker.add(owner.keys.rollouts, b"\xc1 definitely not msgpack")
    await broker.add(owner.keys.rollouts, encode(Annotation(rollout_id=rid("x", 0), key="reward", value=1.0)))
    await publish_group(broker, owner.keys, "g0", [1, 0])
    batch = await asyncio.wait_for(asm.next_batch(0), 10)
    assert batch.group_ids == ["g0"]
    dead = await broker.read(owner.keys.deadletter)
    assert len(dead) == 2
    assert b"not valid msgpack" in dead[0].data and b"does not belong" in dead[1].data


async def test_dynamic_sampling_filters_zero_variance_groups(config, broker):
    cfg, owner, asm = make(config, broker, rollout__groups_per_step=1, loss__kl_beta=0.0, loss__dynamic_sampling=True)
    await asm.start()
    await publish_group(broker, owner.keys, "flat", [1, 1, 1])
    await publish_group(broker, owner.keys, "varied", [1, 0, 1])
    batch = await asyncio.wait_for(asm.next_batch(0), 10)
    assert batch.group_ids == ["varied"] and asm.counters["filtered"] == 1
    assert int(await broker.get(owner.keys.trainer_released)) == 1  # the feeder may admit a replacement


async def test_overlong_penalty_shapes_rewards(config, broker):
    cfg, owner, asm = make(
        config,
        broker,
        rollout__groups_per_step=1,
        loss__kl_beta=0.0,
        generator__max_tokens=4,
        loss__overlong_buffer=2,
        loss__overlong_penalty=1.0,
    )
    await asm.start()
    await publish_group(broker, owner.keys, "g", [1, 1])  # completions of 3 tokens: halfway into the buffer
    batch = await asyncio.wait_for(asm.next_batch(0), 10)
    np.testing.assert_allclose(batch.rewards, [0.5, 0.5])


async def test_overlong_filter_masks_truncated_completions(config, broker):
    cfg, owner, asm = make(config, broker, rollout__groups_per_step=1, loss__kl_beta=0.0, loss__overlong_filter=True)
    await asm.start()
    keys = owner.keys
    for i, reason in enumerate(["length", "stop"]):
        r = rollout("g", i, n=2)
        r.finish_reason = reason
        await broker.add(keys.rollouts, encode(r))
        await broker.add(keys.annotations, encode(Annotation(rollout_id=rid("g", i), key="reward", value=float(i))))
    batch = await asyncio.wait_for(asm.next_batch(0), 10)
    np.testing.assert_array_equal(batch.loss_mask, [0.0, 1.0])
    assert batch.num_loss_tokens == 3 and batch.num_tokens == 6


async def test_intake_joins_rollouts_that_arrive_during_a_train_step(config, broker):
    """With the background intake, rollouts and annotations published while the trainer trains (a
    blocking step in a thread, as workers/trainer.py runs it) are decoded and joined by the time the
    step ends: the next batch is ready before it is asked for, instead of being read then."""
    import time

    cfg, owner, asm = make(config, broker, rollout__groups_per_step=1, loss__kl_beta=0.0)
    await asm.start()
    asm.start_intake()
    try:
        await publish_group(broker, owner.keys, "g0", [1, 0, 0, 1])
        first = await asyncio.wait_for(asm.next_batch(0), 10)
        assert first.group_ids == ["g0"]

        async def arrive_mid_step():
            await asyncio.sleep(0.3)
            await publish_group(broker, owner.keys, "g1", [0, 1, 1, 0])

        arriving = asyncio.create_task(arrive_mid_step())
        await asyncio.to_thread(time.sleep, 1.5)  # the slow train step
        step_end = time.time()
        await arriving
        assert asm.ready == ["g1"]  # joined during the step, before next_batch is called
        assert asm.groups["g1"].completed_at < step_end
        await asm.commit(first)
        second = await asyncio.wait_for(asm.next_batch(1), 10)
        assert second.group_ids == ["g1"] and len(second) == 4
    finally:
        await asm.stop_intake()
    assert asm._intake is None
