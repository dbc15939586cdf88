"""Writes a failover cannot lose: after the write, wait until a replica has it (`WAIT`).

Redis replicates asynchronously: a master acks a write before any replica has it, and a replica
promoted after the master died holds a prefix of the master's history. A write that something
outside that master acts on (a generator acks its prompt on another node after XADDing the
rollouts; the trainer trains a step after logging it in the ledger) must be on a replica before
its reply comes back, or a failover leaves the effect without its cause (docs/fault-tolerance.md,
"Failover").

`WAIT n timeout` waits for this connection's own writes, so it is pipelined behind the write on
the same connection. When it times out short (a replica lagging, or none), the master's
replication offset is taken and the replicas in state `online` are polled until one reached it;
with no replica online the write is returned at once: no replica, no failover that could lose it.

    waiter = ReplicaWait(replicas=1, timeout_ms=1000)
    [entry_id] = await waiter.write(client, lambda pipe: pipe.xadd(stream, {b"d": data}))
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

import structlog

log = structlog.get_logger("streamrl").bind(component="broker")


def online_offsets(info: dict[str, Any]) -> list[int]:
    """Replication offsets of the replicas in state `online` in an `INFO replication` reply."""
    out = []
    for key, value in info.items():
        if key.startswith("slave") and key[5:].isdigit() and isinstance(value, dict):
            if value.get("state") == "online":
                out.append(int(value.get("offset", 0)))
    return out


class ReplicaWait:
    """WAIT for `replicas` replicas after each durable write (0: off, the write returns at once)."""

    def __init__(self, replicas: int = 0, timeout_ms: int = 1000):
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self.short = 0
        """Writes whose first WAIT came back short (then polled, or returned with no replica online)."""
        self.unreplicated = 0
        """Writes returned with fewer replicas than asked because none was online."""

    async def write(self, client: Any, queue: Callable[[Any], Awaitable[Any] | Any]) -> Any:
        """Run the command(s) `queue(pipe)` puts in a pipeline on `client` and return their replies,
        once `replicas` replicas have them (or none is online)."""
        pipe = client.pipeline(transaction=False)
        queued = queue(pipe)
        if asyncio.iscoroutine(queued):  # a redis-py Script called with client=pipe queues via a coroutine
            await queued
        if self.replicas <= 0:
            return await pipe.execute()
        pipe.execute_command("WAIT", self.replicas, self.timeout_ms)
        *replies, acked = await pipe.execute()
        if int(acked) < self.replicas:
            await self._catch_up(client, int(acked))
        return replies

    async def _catch_up(self, client: Any, acked: int) -> None:
        """After a short WAIT: wait until an online replica passed the master's offset now (our write
        is below it), or return when no replica is online."""
        self.short += 1
        target = int((await client.info("replication")).get("master_repl_offset", 0))
        started = time.monotonic()
        while True:
            offsets = online_offsets(await client.info("replication"))
            if not offsets:
                self.unreplicated += 1
                log.warning(
                    "write_unreplicated",
                    wanted=self.replicas,
                    reason="no replica online: no failover can lose this write until one syncs",
                )
                return
            if sum(o >= target for o in offsets) >= min(self.replicas, len(offsets)):
                return
            log.warning(
                "replica_lagging",
                wanted=self.replicas,
                acked=acked,
                waited_s=round(time.monotonic() - started, 3),
                behind=[target - o for o in offsets],
                reason="the write's upstream ack waits until a replica has it (broker.wait_replicas)",
            )
            await asyncio.sleep(self.timeout_ms / 1000)
