"""RedisBroker against a real redis-server: groups, fan-out, load sharing, acks, takeover, dead letters.

pytest tests/integration/brokers/test_broker.py
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from structlog.testing import capture_logs

from brokers.connect import connect
from brokers.redis_streams import redact
from streamrl.core.broker import Keys
from streamrl.core.errors import BrokerError
from streamrl.core.messages import Control, Rollout, decode, encode
from streamrl.core.worker import Worker

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def _rollout(i: int) -> bytes:
    return encode(
        Rollout(
            rollout_id=f"g{i}:0",
            group_id=f"g{i}",
            sample=0,
            group_size=2,
            prompt_ids=np.arange(3),
            completion_ids=np.arange(4),
            logprobs=np.full(4, -0.5),
            version=0,
        )
    )


async def test_ensure_group_is_idempotent_and_creates_the_stream(broker, run_name):
    s = Keys(run_name).rollouts
    await broker.ensure_group(s, "reward")
    await broker.ensure_group(s, "reward")  # BUSYGROUP is ignored
    assert await broker.stream_len(s) == 0
    assert [g["name"] for g in await broker.group_info(s)] == ["reward"]


async def test_fan_out_every_group_sees_every_entry(broker, run_name):
    s = Keys(run_name).rollouts
    for g in ("reward", "trainer"):
        await broker.ensure_group(s, g)
    ids = await broker.add_many(s, [b"a", b"b", b"c"])
    for g in ("reward", "trainer"):
        got = await broker.read_group(s, g, f"{g}-0", count=10, block_ms=None)
        assert [e.id for e in got] == ids
        assert [e.data for e in got] == [b"a", b"b", b"c"]
        assert got[0].fields == {"d": b"a"}


async def test_two_consumers_share_the_load_without_overlap(broker, run_name):
    s = Keys(run_name).rollouts
    await broker.ensure_group(s, "reward")
    ids = await broker.add_many(s, [str(i).encode() for i in range(40)])
    a, b = [], []
    while True:  # alternate reads, as two workers polling would
        got_a = await broker.read_group(s, "reward", "w-a", count=7, block_ms=None)
        got_b = await broker.read_group(s, "reward", "w-b", count=7, block_ms=None)
        a += [e.id for e in got_a]
        b += [e.id for e in got_b]
        if not got_a and not got_b:
            break
    assert a and b
    assert not set(a) & set(b)
    assert sorted(a + b) == sorted(ids)


async def test_ack_removes_from_pending(broker, run_name):
    s = Keys(run_name).rollouts
    await broker.ensure_group(s, "reward")
    await broker.add_many(s, [b"x", b"y"])
    got = await broker.read_group(s, "reward", "w", count=10, block_ms=None)
    assert (await broker.group_info(s))[0]["pending"] == 2
    assert await broker.ack(s, "reward", [got[0].id]) == 1
    assert (await broker.group_info(s))[0]["pending"] == 1
    assert await broker.ack(s, "reward", []) == 0
    # Only the un-acked one is left for a re-read of own pending entries.
    assert [e.id for e in await broker.read_group(s, "reward", "w", start="0")] == [got[1].id]


async def test_claim_idle_takes_over_a_dead_consumers_entries(broker, run_name):
    s = Keys(run_name).rollouts
    await broker.ensure_group(s, "reward")
    ids = await broker.add_many(s, [b"%d" % i for i in range(5)])
    await broker.read_group(s, "reward", "dead", count=10, block_ms=None)  # reads, then "crashes"
    assert await broker.claim_idle(s, "reward", "alive", min_idle_ms=10_000) == []  # not idle long enough
    await asyncio.sleep(0.15)
    got = await broker.claim_idle(s, "reward", "alive", min_idle_ms=100, count=3)
    assert [e.id for e in got] == ids[:3]  # stops at `count`
    rest = await broker.claim_idle(s, "reward", "alive", min_idle_ms=100, count=10)
    assert [e.id for e in rest] == ids[3:]
    # They now belong to "alive": its own-pending re-read returns all five.
    assert [e.id for e in await broker.read_group(s, "reward", "alive", start="0")] == ids


async def test_offer_hands_a_restarted_consumers_entries_to_its_peers_at_once(broker, run_name):
    s = f"streamrl:{run_name}:prompts"
    await broker.ensure_group(s, "generator")
    for i in range(5):
        await broker.add(s, f"p{i}".encode())
    held = await broker.read_group(s, "generator", "generator-0", count=3)  # its previous life's groups
    assert await broker.claim_idle(s, "generator", "generator-1", min_idle_ms=30_000) == []  # not idle yet
    assert await broker.offer(s, "generator", "generator-0", idle_ms=30_000) == 3
    got = await broker.claim_idle(s, "generator", "generator-1", min_idle_ms=30_000)
    assert [e.id for e in got] == [e.id for e in held]
    assert await broker.offer(s, "generator", "generator-0", idle_ms=30_000) == 0  # nothing left on it
    assert await broker.offer(s, "nogroup", "generator-0", idle_ms=30_000) == 0


async def test_claim_idle_skips_and_acks_deleted_entries(broker, run_name):
    s = Keys(run_name).rollouts
    await broker.ensure_group(s, "reward")
    ids = await broker.add_many(s, [b"a", b"b", b"c"])
    await broker.read_group(s, "reward", "dead", count=10, block_ms=None)
    await broker.client.xdel(s, ids[1])  # trimmed/deleted after delivery
    await asyncio.sleep(0.05)
    got = await broker.claim_idle(s, "reward", "alive", min_idle_ms=20)
    assert [e.id for e in got] == [ids[0], ids[2]]
    pending = await broker.client.xpending_range(s, "reward", "-", "+", 10)
    assert sorted(p["message_id"].decode() for p in pending) == [ids[0], ids[2]]


async def test_own_pending_reread_after_restart(broker, redis_server, run_name):
    s = Keys(run_name).rollouts
    await broker.ensure_group(s, "reward")
    ids = await broker.add_many(s, [b"1", b"2", b"3", b"4"])
    await broker.read_group(s, "reward", "w-0", count=10, block_ms=None)
    await broker.ack(s, "reward", [ids[0]])
    await broker.client.xdel(s, ids[2])  # deleted while pending: skipped and acked, not returned
    # "Restart": a fresh connection, same consumer name, reads its own un-acked entries from "0".
    again = await connect(redis_server.url, retries=1)
    try:
        got = await again.read_group(s, "reward", "w-0", count=10, start="0")
        assert [e.id for e in got] == [ids[1], ids[3]]
        assert [e.data for e in got] == [b"2", b"4"]
        assert await again.read_group(s, "reward", "w-0", start=ids[3]) == []
        assert await again.read_group(s, "reward", "w-0", block_ms=None) == []  # nothing new
    finally:
        await again.close()
    assert (await broker.group_info(s))[0]["pending"] == 2


class _Probe(Worker):
    role = "probe"

    async def step(self) -> bool:
        return False


async def test_decode_entries_dead_letters_malformed_and_acks(broker, config):
    keys = Keys(config.run.name)
    s = keys.rollouts
    await broker.ensure_group(s, "reward")
    good = _rollout(1)
    await broker.add_many(s, [good, b"\xc1 not msgpack"])
    await broker.client.xadd(s, {b"other": b"no d field"})
    worker = _Probe(config, broker, "probe-0")
    decoded = await worker.read(s, "reward", count=10)
    assert len(decoded) == 1 and decoded[0][1].rollout_id == "g1:0"
    assert (await broker.group_info(s))[0]["pending"] == 1  # only the good one awaits its ack
    dead = await broker.read(keys.deadletter)
    assert len(dead) == 2
    records = [json.loads(e.data.split(b"\n", 1)[0]) for e in dead]
    assert "not valid msgpack" in records[0]["reason"] and records[0]["stream"] == s
    assert "no 'd' field" in records[1]["reason"]
    assert dead[0].data.split(b"\n", 1)[1] == b"\xc1 not msgpack"  # the original bytes are kept
    assert worker.stats["dead_lettered"] == 2


async def test_read_groups_over_two_streams(broker, run_name):
    keys = Keys(run_name)
    for s in (keys.rollouts, keys.annotations):
        await broker.ensure_group(s, "trainer")
    await broker.add(keys.rollouts, b"r")
    await broker.add_many(keys.annotations, [b"a1", b"a2"])
    got = await broker.read_groups([keys.rollouts, keys.annotations], "trainer", "t-0", count=10)
    assert [e.data for e in got[keys.rollouts]] == [b"r"]
    assert [e.data for e in got[keys.annotations]] == [b"a1", b"a2"]
    assert await broker.read_groups([keys.rollouts, keys.annotations], "trainer", "t-0", block_ms=20) == {}


async def test_group_info_reports_lag_and_pending(broker, run_name):
    s = Keys(run_name).rollouts
    await broker.ensure_group(s, "reward")
    await broker.ensure_group(s, "trainer")
    await broker.add_many(s, [b"%d" % i for i in range(10)])
    await broker.read_group(s, "reward", "w", count=4, block_ms=None)
    info = {g["name"]: g for g in await broker.group_info(s)}
    assert (info["reward"]["pending"], info["reward"]["lag"], info["reward"]["consumers"]) == (4, 6, 1)
    assert (info["trainer"]["pending"], info["trainer"]["lag"], info["trainer"]["consumers"]) == (0, 10, 0)
    assert await broker.group_info(Keys(run_name).prompts) == []  # no such stream


async def test_vanished_group_is_recreated(broker, run_name):
    s = Keys(run_name).rollouts
    await broker.ensure_group(s, "reward")
    await broker.add(s, b"before")
    await broker.client.xgroup_destroy(s, "reward")
    with capture_logs() as logs:
        got = await broker.read_group(s, "reward", "w", block_ms=None)
    assert [e["group"] for e in logs if e["event"] == "consumer_group_recreated"] == ["reward"]
    assert [e.data for e in got] == [b"before"]  # recreated from the start: nothing skipped


async def test_add_trims_approximately_and_plain_reads(broker, run_name):
    s = Keys(run_name).metrics
    for _ in range(5):
        await broker.add_many(s, [b"m"] * 400, maxlen=100)
    assert 100 <= await broker.stream_len(s) < 2000
    last = (await broker.read(s, count=1))[0].id
    assert len(await broker.read(s, last_id=last, count=5)) == 5
    assert await broker.read(Keys(run_name).control, block_ms=10) == []


async def test_keys_hashes_counters_and_scan(broker, run_name):
    k = Keys(run_name)
    await broker.set(k.trainer_version, 3)
    assert await broker.get(k.trainer_version) == b"3"
    assert await broker.incr(k.feeder_admitted) == 1 and await broker.incr(k.feeder_admitted, 4) == 5
    await broker.hset(k.weights_latest, {"version": 2, "handle": "shm://x", "bytes": 10.5})
    assert await broker.hgetall(k.weights_latest) == {"version": b"2", "handle": b"shm://x", "bytes": b"10.5"}
    await broker.set(k.worker("reward", "r-0"), b"{}", ttl_s=0.05)
    assert await broker.scan(k.prefix + "workers:*") == [k.worker("reward", "r-0")]
    await asyncio.sleep(0.1)
    assert await broker.get(k.worker("reward", "r-0")) is None  # heartbeat expired
    await broker.delete(k.trainer_version, k.weights_latest)
    assert await broker.get(k.trainer_version) is None and await broker.hgetall(k.weights_latest) == {}


async def test_connect_gives_up_with_a_redacted_error():
    with pytest.raises(BrokerError) as err:
        await connect("redis://:s3cret@127.0.0.1:1/0", retries=2, backoff_base_s=0.01)
    assert "s3cret" not in str(err.value) and "127.0.0.1:1" in str(err.value) and "broker.url" in str(err.value)
    assert redact("redis://user:pw@h:1/0") == "redis://user:***@h:1/0" and redact("redis://h:1") == "redis://h:1"


async def test_a_control_message_round_trips_through_the_stream(broker, run_name):
    s = Keys(run_name).control
    await broker.add(s, encode(Control(action="stop", reason="test")))
    (entry,) = await broker.read(s)
    assert decode(entry.data) == Control(action="stop", reason="test")


@pytest.mark.anyio
async def test_touch_keeps_in_progress_entries_from_being_claimed(broker, run_name):
    import asyncio as _asyncio

    stream = f"streamrl:{run_name}:touch"
    await broker.ensure_group(stream, "g")
    await broker.add(stream, b"x")
    [entry] = await broker.read_group(stream, "g", "busy", count=1, block_ms=None)
    await _asyncio.sleep(0.3)
    await broker.touch(stream, "g", "busy", [entry.id])
    assert await broker.claim_idle(stream, "g", "thief", min_idle_ms=200) == []
    await _asyncio.sleep(0.3)
    stolen = await broker.claim_idle(stream, "g", "thief", min_idle_ms=200)
    assert [e.id for e in stolen] == [entry.id]


async def _pending(broker, stream: str, group: str) -> int:
    return (await broker.client.xpending(stream, group))["pending"]


async def _evalsha_calls(broker) -> int:
    return int((await broker.client.info("commandstats")).get("cmdstat_evalsha", {}).get("calls", 0))


async def test_ack_many_acks_several_streams_in_one_round_trip(broker, run_name):
    keys = Keys(run_name)
    r_ids, a_ids = [], []
    for stream, ids, n in ((keys.rollouts, r_ids, 1200), (keys.annotations, a_ids, 3)):
        await broker.ensure_group(stream, "trainer")
        ids += await broker.add_many(stream, [b"%d" % i for i in range(n)])
        assert len(await broker.read_group(stream, "trainer", "t", count=n + 1, block_ms=None)) == n
    assert await broker.ack_many("trainer", {keys.rollouts: [], keys.annotations: []}) == 0
    assert await broker.ack_many("trainer", {keys.rollouts: r_ids[:1], keys.annotations: a_ids[:1]}) == 2
    calls = await _evalsha_calls(broker)  # the script is loaded now (redis-py's first EVALSHA loads it)
    # 1,198 rollout ids: past the script's 500-id slices (Lua's unpack() has a stack limit).
    assert await broker.ack_many("trainer", {keys.rollouts: r_ids[1:-1], keys.annotations: a_ids[1:]}) == 1200
    assert await _evalsha_calls(broker) == calls + 1
    assert await _pending(broker, keys.rollouts, "trainer") == 1
    assert await _pending(broker, keys.annotations, "trainer") == 0
    assert await broker.ack_many("trainer", {keys.rollouts: r_ids, keys.annotations: a_ids}) == 1  # idempotent


async def test_add_and_ack_publishes_then_acks_in_one_round_trip(broker, run_name):
    keys = Keys(run_name)
    await broker.ensure_group(keys.rollouts, "reward")
    ids = await broker.add_many(keys.rollouts, [b"r1", b"r2"])
    await broker.read_group(keys.rollouts, "reward", "w", count=10, block_ms=None)
    await broker.add_and_ack(keys.annotations, [b"a0"], keys.rollouts, "reward", ids[:1])  # loads the script
    calls = await _evalsha_calls(broker)
    added = await broker.add_and_ack(keys.annotations, [b"a1", b"a2"], keys.rollouts, "reward", ids[1:], maxlen=100)
    assert await _evalsha_calls(broker) == calls + 1
    assert [e.data for e in await broker.read(keys.annotations)] == [b"a0", b"a1", b"a2"]
    assert [e.id for e in await broker.read(keys.annotations)][1:] == added
    assert await _pending(broker, keys.rollouts, "reward") == 0
    # Without scripts (a restricted producer user): the same effects, the ack after the add.
    broker._batch_script = False
    more = await broker.add_many(keys.rollouts, [b"r3"])
    await broker.read_group(keys.rollouts, "reward", "w", count=10, block_ms=None)
    assert len(await broker.add_and_ack(keys.annotations, [b"a3"], keys.rollouts, "reward", more)) == 1
    assert await _pending(broker, keys.rollouts, "reward") == 0
    assert await broker.ack_many("reward", {keys.rollouts: more, keys.annotations: []}) == 0
