"""broker.wait_replicas: a write whose reply came back survives the master's death (SIGKILL) and
its replica's promotion; without it, a lagging replica loses acked writes (the hole it closes).

Real redis-servers: a master and a replica fed through a proxy that freezes (tests/replica_pair.py),
so "the replica had not received it yet" happens on cue instead of by chance.

    pytest tests/integration/brokers/test_failover_wait.py
"""

from __future__ import annotations

import asyncio
import time

import pytest

from brokers.connect import connect
from brokers.replica_wait import ReplicaWait, StaleTopology
from streamrl.core import accounting
from streamrl.core.broker import Keys
from tests.replica_pair import ReplicaPair

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


async def _produce(broker, keys: Keys, acked: list[int]) -> None:
    """What the roles do: append an entry, log a ledger step; a step counts once both replies came back."""
    i = 0
    while True:
        await broker.add(keys.rollouts, f"r{i}".encode())
        await accounting.log_step(broker, keys, i, [f"g{i}"], [f"r{i}"])
        acked.append(i)
        i += 1
        await asyncio.sleep(0.005)


async def _kill_while_lagging(tmp_path, wait: ReplicaWait) -> tuple[list[int], int, set[int], int]:
    """Produce, freeze the replica's link, produce on, fail over. Returns (acked, acked before the
    freeze, steps the promoted replica has, rollout entries it has)."""
    keys = Keys("failover")
    async with ReplicaPair(tmp_path) as pair:
        broker = await connect(f"redis://127.0.0.1:{pair.master_port}/0", retries=0, durable=wait)
        acked: list[int] = []
        producer = asyncio.create_task(_produce(broker, keys, acked))
        while len(acked) < 20:
            await asyncio.sleep(0.01)
        pair.proxy.freeze()
        frozen_at = len(acked)
        await asyncio.sleep(1.0)
        replica = await pair.fail_over()
        producer.cancel()
        await asyncio.gather(producer, return_exceptions=True)
        await broker.close(timeout_s=2)
        steps = {int(s) for s in replica.hkeys(keys.ledger_steps)}
        return acked, frozen_at, steps, replica.xlen(keys.rollouts)


async def test_with_wait_no_acked_write_is_lost(tmp_path) -> None:
    acked, frozen_at, steps, entries = await _kill_while_lagging(tmp_path, ReplicaWait(replicas=1, timeout_ms=100))
    # While the replica could not receive, no reply came back (at most the write in flight at the freeze).
    assert len(acked) <= frozen_at + 1, f"{len(acked) - frozen_at} writes acked while no replica had them"
    assert set(acked) <= steps, f"acked ledger steps lost at the failover: {sorted(set(acked) - steps)}"
    assert entries >= len(acked)


async def test_without_wait_acked_writes_are_lost(tmp_path) -> None:
    acked, frozen_at, steps, entries = await _kill_while_lagging(tmp_path, ReplicaWait(replicas=0))
    lost = set(acked) - steps
    assert len(acked) > frozen_at + 10, "the master kept acking while the replica lagged"
    assert lost, "the lagging replica had every acked step: the test no longer shows the hole"
    assert entries < len(acked)


async def test_no_replica_online_the_write_returns(tmp_path) -> None:
    """Without a replica nothing can be promoted, so nothing to wait for: the write returns, counted."""
    async with ReplicaPair(tmp_path) as pair:
        wait = ReplicaWait(replicas=1, timeout_ms=200)
        broker = await connect(f"redis://127.0.0.1:{pair.master_port}/0", retries=0, durable=wait)
        pair.kill(pair.replica_port)
        while pair.client(pair.master_port).info("replication")["connected_slaves"]:
            await asyncio.sleep(0.01)
        t0 = time.monotonic()
        await broker.add("s", b"x")
        assert time.monotonic() - t0 < 2.0
        assert (wait.short, wait.unreplicated) == (1, 1)
        t0 = time.monotonic()
        for _ in range(5):  # known alone: no WAIT that could only time out
            await broker.add("s", b"x")
        assert time.monotonic() - t0 < 0.2 * 5, "writes to a master without a replica each waited out a WAIT"
        assert (wait.short, wait.unreplicated) == (1, 6)
        await broker.close(timeout_s=2)


class _StaleOnce(ReplicaWait):
    """The catch-up's first round meets a stale slot map (what a slot refresh answered by a node that has
    not seen the failover yet gives): the path of CI's duplicated entry on 2026-12-06."""

    stale = 1

    async def _catch_up(self, client, key: str) -> None:
        if self.stale:
            self.stale -= 1
            raise StaleTopology("node is a replica now (the slot map predates a failover)")
        await super()._catch_up(client, key)


async def test_a_stale_map_after_the_write_retries_the_catch_up_not_the_write(redis_server) -> None:
    wait = _StaleOnce(replicas=1, timeout_ms=50)  # the embedded server has no replica: every WAIT is short
    broker = await connect(redis_server.url, retries=0, durable=wait)
    key = "streamrl:stale_once:rollouts"
    try:
        entry = await broker.add(key, b"once")
        assert wait.stale == 0, "the catch-up did not run (the WAIT was not short)"
        entries = await broker.read(key, "0", count=10)
        assert [e.id for e in entries] == [entry], "the write was repeated after its reply came back"
        assert wait.short == 1
    finally:
        await broker.client.delete(key)
        await broker.close(timeout_s=2)
