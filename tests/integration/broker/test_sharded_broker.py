"""A job's message path over two redis-servers (brokers/sharded.py): rollouts on one, annotations
on the other; the real RewardWorker, a reference annotator and the real Assembler join across both.

    pytest tests/integration/broker/test_sharded_broker.py
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import redis

from bench.broker import BenchReference
from brokers.embedded import EmbeddedRedis
from brokers.sharded import ShardedBroker, connect_sharded
from streamrl.assemble.assembler import Assembler
from streamrl.config.schema import BrokerConfig, Config, LossConfig, RewardConfig, RolloutConfig, RunConfig
from streamrl.core.broker import Keys
from streamrl.core.errors import ConfigError
from streamrl.core.messages import Rollout, encode
from streamrl.core.worker import Worker
from workers.reward import RewardWorker

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
PLACEMENT = {"rollouts": 0, "annotations": 1}


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory):
    servers = [EmbeddedRedis(tmp_path_factory.mktemp(f"shard{i}")).start() for i in range(2)]
    yield servers
    for s in servers:
        s.stop()


@pytest.fixture
async def sharded(two_servers):
    broker = await connect_sharded([s.url for s in two_servers], PLACEMENT, retries=3)
    for b in broker.shards:
        await b.client.flushall()
    yield broker
    await broker.close()


def _rollout(group: int, sample: int, group_size: int) -> bytes:
    return encode(
        Rollout(
            rollout_id=f"g{group}:{sample}:s0",
            group_id=f"g{group}",
            sample=sample,
            group_size=group_size,
            prompt_ids=np.arange(5),
            completion_ids=np.arange(8) + sample,
            logprobs=np.full(8, -0.25, np.float32),
            version=0,
        )
    )


async def test_job_path_joins_across_two_servers(sharded, two_servers, run_name):
    cfg = Config(
        run=RunConfig(name=run_name),
        broker=BrokerConfig(url=two_servers[0].url, claim_idle_ms=200, block_ms=50),
        rollout=RolloutConfig(group_size=2, groups_per_step=2),
        reward=RewardConfig(fn="bench.broker:bench_reward"),
        loss=LossConfig(kl_beta=0.001),
    )
    keys = Keys(run_name)
    reward, reference = RewardWorker(cfg, sharded, "reward-0"), BenchReference(cfg, sharded, "reference-0")
    trainer = Worker(cfg, sharded, "trainer-0")
    assembler = Assembler(cfg, sharded, trainer, consumer="trainer-0")
    for w in (reward, reference):
        await w.start()
    await assembler.start()
    await sharded.add_many(keys.rollouts, [_rollout(g, s, 2) for g in range(2) for s in range(2)])
    while await reward.step() or await reference.step():
        pass
    batch = await assembler.next_batch(0)
    assert batch.group_ids == ["g0", "g1"] and len(batch) == 4
    assert np.allclose(batch.rewards, 1.0)
    assert all(np.allclose(r, -0.25) for r in batch.ref_logprobs)
    await assembler.commit(batch)

    # Each stream lives (entries, groups, pending lists) on the server the placement names.
    s0, s1 = (redis.Redis.from_url(s.url) for s in two_servers)
    try:
        assert s0.xlen(keys.rollouts) == 4 and not s1.exists(keys.rollouts)
        assert s1.xlen(keys.annotations) == 8 and not s0.exists(keys.annotations)
        assert {g["name"].decode(): g["pending"] for g in s0.xinfo_groups(keys.rollouts)} == {
            "reward": 0,
            "reference": 0,
            "trainer": 0,
        }
        assert s1.xinfo_groups(keys.annotations)[0]["pending"] == 0
    finally:
        s0.close()
        s1.close()


async def test_blocking_read_over_two_servers_wakes_on_either(sharded, run_name):
    keys = Keys(run_name)
    for s in (keys.rollouts, keys.annotations):
        await sharded.ensure_group(s, "trainer")
    await sharded.add(keys.annotations, b"a")
    t0 = time.monotonic()
    got = await sharded.read_groups([keys.rollouts, keys.annotations], "trainer", "t-0", block_ms=5000)
    assert time.monotonic() - t0 < 1.0
    assert [e.data for e in got[keys.annotations]] == [b"a"] and keys.rollouts not in got
    t0 = time.monotonic()
    assert await sharded.read_groups([keys.rollouts, keys.annotations], "trainer", "t-0", block_ms=100) == {}
    assert time.monotonic() - t0 >= 0.09


async def test_plain_keys_scan_and_delete_span_servers(sharded, run_name):
    keys = Keys(run_name)
    await sharded.set(keys.trainer_version, 3)
    await sharded.add(keys.rollouts, b"r")
    await sharded.add(keys.annotations, b"a")
    assert int(await sharded.get(keys.trainer_version)) == 3
    assert set(await sharded.scan(keys.prefix + "*")) == {keys.trainer_version, keys.rollouts, keys.annotations}
    await sharded.delete(keys.rollouts, keys.annotations, keys.trainer_version)
    assert await sharded.scan(keys.prefix + "*") == []


async def test_placement_outside_the_servers_names_the_fix(sharded):
    with pytest.raises(ConfigError, match="list 3 URLs"):
        ShardedBroker(sharded.shards, {"rollouts": 2})


async def test_scripts_run_where_their_keys_live(sharded, run_name):
    keys = Keys(run_name)
    src = "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('XLEN', KEYS[2])"
    await sharded.add(keys.prompts, b"p")  # prompts and counters: not placed, both on server 0
    assert await sharded.script(src, [keys.feeder_admitted, keys.prompts], [7]) == 1
    assert int(await sharded.get(keys.feeder_admitted)) == 7
    with pytest.raises(ConfigError, match="place these keys on one server"):
        await sharded.script(src, [keys.feeder_admitted, keys.annotations], [1])


async def test_acks_and_publish_then_ack_span_servers(sharded, run_name):
    keys = Keys(run_name)
    ids = {}
    for stream in (keys.rollouts, keys.annotations):
        await sharded.ensure_group(stream, "trainer")
        ids[stream] = await sharded.add_many(stream, [b"x", b"y"])
        await sharded.read_group(stream, "trainer", "t", count=10, block_ms=None)
    assert await sharded.ack_many("trainer", ids) == 4  # one call per server
    for stream in ids:
        assert (await sharded.group_info(stream))[0]["pending"] == 0
    await sharded.ensure_group(keys.rollouts, "reward")
    await sharded.read_group(keys.rollouts, "reward", "w", count=10, block_ms=None)
    added = await sharded.add_and_ack(keys.annotations, [b"a"], keys.rollouts, "reward", ids[keys.rollouts])
    assert [e.id for e in await sharded.read(keys.annotations)][-1:] == added
    assert {g["name"]: g["pending"] for g in await sharded.group_info(keys.rollouts)}["reward"] == 0
