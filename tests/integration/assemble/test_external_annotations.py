"""The assembler with external annotation keys against a real redis-server: join, weighted reward,
timeout -> default, timeout -> drop, error annotations, late annotations after a timeout."""

import asyncio
import time

import numpy as np
import pytest

from streamrl.config.schema import AnnotationsConfig, ExternalAnnotation
from streamrl.core.messages import Annotation, encode
from tests.integration.assemble.test_assembler import make, publish_group, rid

pytestmark = pytest.mark.anyio


def external(config, broker, **spec):
    cfg = config.model_copy(deep=True)
    cfg.loss.kl_beta = 0.0
    cfg.rollout.groups_per_step = 1
    cfg.annotations = AnnotationsConfig(reward_weight=1.0, external=[ExternalAnnotation(key="judge", **spec)])
    return make(cfg, broker)


async def judge(broker, keys, gid, values, error=""):
    for i, v in enumerate(values):
        await broker.add(
            keys.annotations,
            encode(Annotation(rollout_id=rid(gid, i), key="judge", value=float(v), producer="test-judge", error=error)),
        )


async def test_external_scores_join_and_combine(config, broker):
    cfg, owner, asm = external(config, broker, weight=0.5, timeout_s=30)
    await asm.start()
    await publish_group(broker, owner.keys, "g0", [1, 0, 0, 1])
    with pytest.raises(asyncio.TimeoutError):  # waits for the judge
        await asyncio.wait_for(asm.next_batch(0), 0.8)
    await judge(broker, owner.keys, "g0", [0.2, 0.4, 0.6, 0.8])
    batch = await asyncio.wait_for(asm.next_batch(0), 10)
    np.testing.assert_allclose(batch.reward_components["reward"], [1, 0, 0, 1])
    np.testing.assert_allclose(batch.reward_components["judge"], [0.2, 0.4, 0.6, 0.8], rtol=1e-6)
    np.testing.assert_allclose(batch.rewards, [1.1, 0.2, 0.3, 1.4], rtol=1e-6)
    assert batch.stats["annotation_timeouts"] == 0
    await asm.commit(batch)
    info = {g["name"]: g for g in await broker.group_info(owner.keys.annotations)}
    assert info["trainer"]["pending"] == 0


async def test_timeout_fills_the_default(config, broker):
    cfg, owner, asm = external(config, broker, weight=1.0, timeout_s=0.5, on_timeout="default", default=-0.25)
    await asm.start()
    await publish_group(broker, owner.keys, "g0", [1, 0])
    await judge(broker, owner.keys, "g0", [0.9])  # only sample 0 is judged in time
    t0 = time.time()
    batch = await asyncio.wait_for(asm.next_batch(0), 10)
    assert time.time() - t0 >= 0.4
    np.testing.assert_allclose(batch.reward_components["judge"], [0.9, -0.25])
    np.testing.assert_allclose(batch.rewards, [1.9, -0.25])
    assert batch.stats["annotation_timeouts"] == 1
    await asm.commit(batch)  # the stand-in has no entry; the real ones are acked
    info = {g["name"]: g for g in await broker.group_info(owner.keys.annotations)}
    assert info["trainer"]["pending"] == 0
    await judge(broker, owner.keys, "g0", [0.9, 0.9])  # late answers after the group trained: acked, ignored
    await asm.poll()
    assert asm.counters["late"] == 2


async def test_timeout_drops_the_group_and_releases_its_slot(config, broker):
    cfg, owner, asm = external(config, broker, timeout_s=0.3, on_timeout="drop")
    await asm.start()
    await publish_group(broker, owner.keys, "g0", [1, 0])
    await publish_group(broker, owner.keys, "g1", [0, 1])
    await judge(broker, owner.keys, "g1", [0.5, 0.5])
    batch = await asyncio.wait_for(asm.next_batch(0), 10)
    assert batch.group_ids == ["g1"]
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(asm.next_batch(0), 1.0)
    assert asm.counters["dropped_timeout"] == 1
    assert int(await broker.get(owner.keys.trainer_released)) == 1
    await asm.commit(batch)
    info = {g["name"]: g for g in await broker.group_info(owner.keys.rollouts)}
    assert info["trainer"]["pending"] == 0  # g0's entries were acked when it was dropped


async def test_error_annotation_applies_the_policy_at_once(config, broker):
    cfg, owner, asm = external(config, broker, timeout_s=300, on_timeout="default", default=0.0)
    await asm.start()
    await publish_group(broker, owner.keys, "g0", [1, 1])
    await judge(broker, owner.keys, "g0", [0.7, 0.7], error="judge overloaded")
    batch = await asyncio.wait_for(asm.next_batch(0), 5)  # no 300 s wait: the producer gave up
    np.testing.assert_allclose(batch.reward_components["judge"], [0.0, 0.0])
    await asm.commit(batch)
    cfg, owner, asm = external(config, broker, timeout_s=300, on_timeout="drop")
    await asm.start()
    await publish_group(broker, owner.keys, "h0", [1, 1])
    await judge(broker, owner.keys, "h0", [0.7], error="sandbox crashed")
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(asm.next_batch(0), 1.0)
    assert asm.counters["failed"] == 1
