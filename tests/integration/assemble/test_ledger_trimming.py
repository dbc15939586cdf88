"""The group ledger (streamrl/core/accounting.py) and stream trimming (streamrl/core/trimming.py) on a real redis-server."""

import numpy as np
import pytest

from streamrl.core import accounting
from streamrl.core.messages import Prompt, Rollout, encode
from streamrl.core.trimming import stream_groups, trim_stream, trim_streams

pytestmark = pytest.mark.anyio


def prompt(i: int) -> bytes:
    return encode(Prompt(group_id=f"g{i}", prompt_ids=np.array([5, 6]), group_size=2, admitted_version=0))


def rollout(gid: str, s: int) -> bytes:
    return encode(
        Rollout(
            rollout_id=f"{gid}:{s}",
            group_id=gid,
            sample=s,
            group_size=2,
            prompt_ids=np.array([5]),
            completion_ids=np.array([6]),
            logprobs=np.array([-1.0]),
            version=0,
        )
    )


async def test_close_group_is_once_and_releases_atomically(broker):
    from streamrl.core.broker import Keys

    keys = Keys("ledger")
    assert await accounting.close_group(broker, keys, "g1", "dropped_stale")
    assert not await accounting.close_group(broker, keys, "g1", "filtered")  # a retry/redelivery: no-op
    assert await accounting.close_group(broker, keys, "g2", "requeued", release=False)
    assert int(await broker.get(keys.trainer_released)) == 1
    assert await accounting.outcomes(broker, keys) == {"g1": "dropped_stale", "g2": "requeued"}


async def test_log_step_is_write_once_and_flags_double_training(broker):
    from streamrl.core.broker import Keys

    keys = Keys("steps")
    new, rec = await accounting.log_step(broker, keys, 1, ["g0", "g1"], ["g0:0", "g1:0"])
    assert new and rec["clashes"] == 0
    new, rec = await accounting.log_step(broker, keys, 1, ["g0", "g1"], ["g0:0", "g1:0"])  # a replay
    assert not new and rec["groups"] == ["g0", "g1"]
    new, rec = await accounting.log_step(broker, keys, 2, ["g1", "g2"], ["g1:0", "g2:0"])
    assert new and rec["clashes"] == 1  # g1 was already in step 1
    replay, closed, groups = await accounting.resume_plan(broker, keys, version=1)
    assert sorted(replay) == [2] and groups == {"g1", "g2"} and closed == {"g0"}


async def test_admit_appends_and_sets_the_counter_atomically(broker):
    from streamrl.core.broker import Keys

    keys = Keys("admit")
    await accounting.admit(broker, keys, [prompt(0), prompt(1)], 2)
    await accounting.admit(broker, keys, [prompt(2)], 3)
    assert int(await broker.get(keys.feeder_admitted)) == 3 and await broker.stream_len(keys.prompts) == 3


async def test_summary_counts_lost_in_flight_and_double_trained(broker, redis_server):
    from streamrl.core.broker import Keys

    keys = Keys("summary")
    await accounting.admit(broker, keys, [prompt(i) for i in range(5)], 5)
    await broker.ensure_group(keys.prompts, "generator")
    # g0, g1: trained in checkpointed step 1; g2: dropped; g3: prompt still pending; g4: vanished.
    for entry in await broker.read_group(keys.prompts, "generator", "gen-0", count=5, block_ms=None):
        if b"g3" not in entry.data:
            await broker.ack(keys.prompts, "generator", [entry.id])
    await accounting.log_step(broker, keys, 1, ["g0", "g1"], ["g0:0", "g0:1", "g1:0", "g1:1"])
    await broker.set(accounting.LedgerKeys(keys).checkpointed, 1)
    await accounting.close_group(broker, keys, "g2", "dropped_stale")
    s = accounting.summarize(redis_server.url, "summary")
    assert (s["admitted"], s["trained"], s["dropped_stale"], s["in_flight"], s["lost"]) == (5, 2, 1, 1, 1)
    assert s["lost_groups"] == ["g4"] and not s["invariant_holds"]
    assert s["dropped_stale_frac"] == 0.2  # 1 of 5 admitted groups generated in vain
    # A rollout in two checkpointed steps is double-trained.
    await accounting.log_step(broker, keys, 2, ["g4"], ["g4:0", "g0:0"])
    await broker.set(accounting.LedgerKeys(keys).checkpointed, 2)
    s = accounting.summarize(redis_server.url, "summary")
    assert s["double_trained"] == 1 and s["lost"] == 0 and s["trained"] == 3


async def test_trim_keeps_everything_some_group_has_not_consumed(broker, config):
    keys = __import__("streamrl.core.broker", fromlist=["Keys"]).Keys(config.run.name)
    stream = keys.rollouts
    ids = [await broker.add(stream, rollout(f"g{i}", 0)) for i in range(300)]
    await broker.ensure_group(stream, "reward")
    await broker.ensure_group(stream, "trainer")
    assert await trim_stream(broker, stream, ["reward", "trainer", "reference"]) == -2  # a group is missing
    # reward consumed and acked all; trainer read 250 and acked all but the entry at index 120.
    got = await broker.read_group(stream, "reward", "r", count=300, block_ms=None)
    await broker.ack(stream, "reward", [e.id for e in got])
    got = await broker.read_group(stream, "trainer", "t", count=250, block_ms=None)
    await broker.ack(stream, "trainer", [e.id for e in got if e.id != ids[120]])
    removed = await trim_stream(broker, stream, ["reward", "trainer"])
    left = [e.id for e in await broker.read(stream, "0", count=1000)]
    assert 0 < removed <= 120 and ids[120] in left and left == ids[len(ids) - len(left) :]
    # The held entry is still claimable after the trim; acking it lets the trim go further.
    await broker.ack(stream, "trainer", [ids[120]])
    await trim_stream(broker, stream, ["reward", "trainer"])
    assert await broker.stream_len(stream) < len(left)
    assert set(await trim_streams(broker, config)) == set(stream_groups(config))
