"""The assembler over partitioned streams (rollout.partitions > 1, streamrl.core.broker.Keys) on a real
redis-server, and the same over the local Redis Cluster: groups on every partition join and are acked
on their own partition; an annotation read before its rollout is not mistaken for an unknown one
because another partition caught up.

    pytest tests/integration/assemble/test_partitions.py
"""

from __future__ import annotations

import asyncio

import pytest

from brokers.connect import connect
from streamrl.core.messages import Annotation, encode
from tests.integration.assemble.test_assembler import GROUP, make, rid, rollout

pytestmark = pytest.mark.anyio


def groups_of(keys, partition: int, n: int) -> list[str]:
    return [g for g in (f"g{i}" for i in range(1000)) if keys.partition_of(g) == partition][:n]


async def publish(broker, keys, gid: str, rewards) -> None:
    for i, value in enumerate(rewards):
        await broker.add(keys.rollouts_for(gid), encode(rollout(gid, i, n=len(rewards))))
        await broker.add(
            keys.annotations_for(gid), encode(Annotation(rollout_id=rid(gid, i), key="reward", value=value))
        )


async def check_every_partition_joins_and_acks(config, broker):
    cfg, owner, asm = make(config, broker, rollout__partitions=3, rollout__groups_per_step=3, loss__kl_beta=0.0)
    keys = owner.keys
    await asm.start()
    gids = [groups_of(keys, p, 1)[0] for p in range(3)]
    for gid in gids:
        await publish(broker, keys, gid, [1.0, 0.0])
    batch = await asyncio.wait_for(asm.next_batch(0), 20)
    assert sorted(batch.group_ids) == sorted(gids)
    await asm.commit(batch)
    for stream in keys.rollout_streams + keys.annotation_streams:
        assert {g["name"]: g["pending"] for g in await broker.group_info(stream)}[GROUP] == 0, stream
        assert await broker.stream_len(stream) >= 2  # each partition carried its group


async def test_groups_on_every_partition_join_and_are_acked_there(config, broker):
    await check_every_partition_joins_and_acks(config, broker)


async def test_the_same_over_the_cluster(config, redis_cluster):
    cluster = await connect(redis_cluster.url, retries=2)
    try:
        cfg = config.model_copy(deep=True)
        cfg.broker.url = redis_cluster.url
        await check_every_partition_joins_and_acks(cfg, cluster)
    finally:
        await cluster.close()


async def test_an_early_annotation_waits_for_its_own_partitions_rollouts(config, broker):
    cfg, owner, asm = make(config, broker, rollout__partitions=2, rollout__groups_per_step=1, loss__kl_beta=0.0)
    keys = owner.keys
    await asm.start()
    gid = groups_of(keys, 1, 1)[0]
    for i in range(2):  # the annotations first: a reward worker faster than the trainer's read of rollouts
        await broker.add(keys.annotations_for(gid), encode(Annotation(rollout_id=rid(gid, i), key="reward", value=1.0)))
    await asm.poll()  # partition 0 caught up; the annotations are held
    for i in range(2):
        await broker.add(keys.rollouts_for(gid), encode(rollout(gid, i, n=2)))
    # The next poll reads partition 0 first and finds it caught up: that says nothing about partition 1.
    batch = await asyncio.wait_for(asm.next_batch(0), 20)
    assert batch.group_ids == [gid] and asm.counters["unknown_annotations"] == 0
