"""Writes a failover cannot lose: after the write, wait until a replica has it (`WAIT`).

Redis replicates asynchronously: a master acks a write before any replica has it, and a replica
promoted after the master died holds a prefix of the master's history. A write that something
outside that master acts on (a generator acks its prompt on another node after XADDing the
rollouts; the trainer trains a step after logging it in the ledger) must be on a replica before
its reply comes back, or a failover leaves the effect without its cause (docs/fault-tolerance.md,
"Failover").

`WAIT n timeout` waits for this connection's own writes, so it is pipelined behind the write on
the same connection (on a cluster: sent to the node of the key). When it comes back short (a replica
lagging, or none; or a failover moved the key while the call ran), a marker is written after it on
the key's node and WAITed for, until a replica has it; with no replica online the write is returned:
no replica, no failover that could lose it.

    waiter = ReplicaWait(replicas=1, timeout_ms=1000)
    [entry_id] = await waiter.write(client, stream, lambda pipe: pipe.xadd(stream, {b"d": data}))
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

import structlog
from redis.exceptions import ClusterDownError, RedisClusterException, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = structlog.get_logger("streamrl").bind(component="broker")
RETRIES = 8
"""Attempts of a durable write through a failover (back-off 0.1 s doubling to 2 s: ~10 s, past a
cluster's failover at cluster-node-timeout plus an election)."""
RETRY_BASE_S, RETRY_CAP_S = 0.1, 2.0
ALONE_RECHECK_S = 0.5
"""A node that had no replica online is asked again (INFO, no WAIT) this often: writes to it meanwhile
do not wait (a WAIT there would only time out)."""


def transient(exc: BaseException) -> bool:
    """A broker error a failover causes (the node went away mid-command), worth the same command again.
    uvloop raises RuntimeError("... the handler is closed") where asyncio raises ConnectionError, when
    redis-py writes on a connection whose node died under it."""
    if isinstance(exc, (RedisConnectionError, RedisTimeoutError, RedisClusterException, ClusterDownError)):
        return True
    if demoted(exc):
        return True
    return isinstance(exc, RuntimeError) and "handler is closed" in str(exc)


def demoted(exc: BaseException) -> bool:
    """The node a WAIT (or INFO) was sent to is a replica now: the client's slot map is older than a
    failover (a killed master came back as its successor's replica). Redis answers a WAIT on a replica
    with "WAIT cannot be used with replica instances"; the write itself followed the MOVED redirect to
    the new master, so the call is retried on a fresh slot map."""
    if isinstance(exc, StaleTopology):
        return True
    return isinstance(exc, ResponseError) and "cannot be used with replica" in str(exc)


class StaleTopology(Exception):
    """The client's slot map names a replica as the key's master (a failover it has not seen yet)."""


def online_replicas(info: dict[str, Any]) -> int:
    """Replicas in state `online` in an `INFO replication` reply (one syncing from scratch cannot be promoted
    with our write: it has no dataset yet)."""
    return sum(
        1
        for key, value in info.items()
        if key.startswith("slave") and key[5:].isdigit() and isinstance(value, dict) and value.get("state") == "online"
    )


def touch_key(key: str, cluster: bool) -> str:
    """A key in `key`'s slot for the catch-up's marker write (in the run's namespace, so a producer's ACL
    that may write `key` may write it too)."""
    start = key.find("{")
    tagged = start >= 0 and key.find("}", start + 2) > start
    return f"{key}:replica_wait" if tagged or not cluster else f"{{{key}}}:replica_wait"


class ReplicaWait:
    """WAIT for `replicas` replicas after each durable write (0: off, the write returns at once)."""

    def __init__(self, replicas: int = 0, timeout_ms: int = 1000):
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self.short = 0
        """Writes whose first WAIT came back short (then waited for, or returned with no replica online)."""
        self.unreplicated = 0
        """Writes returned with fewer replicas than asked because none was online."""
        self._alone: dict[str, float] = {}
        """Node name ('' for a single server) -> when to ask again whether a replica is online."""

    async def write(self, client: Any, key: str, queue: Callable[[Any], Awaitable[Any] | Any]) -> list:
        """Run the command(s) `queue(pipe)` puts in a pipeline on `client` (all on `key`'s node) and return
        their replies, once `replicas` replicas have them (or none is online)."""
        # A failover under way (the client's own retries are spent, or a cluster pipeline lost the WAIT's
        # target on its retry): write again, as redis-py's retry would; what streamrl writes tolerates a
        # repeat (docs/fault-tolerance.md, "Failover"). Once the write's replies are in, only the catch-up
        # is retried (_write): repeating a done write would add a second copy of it.
        return await _through_failover(client, key, "durable_write_retry", lambda: self._write(client, key, queue))

    async def _write(self, client: Any, key: str, queue: Callable[[Any], Awaitable[Any] | Any]) -> list:
        node = _node(client, key)
        pipe = client.pipeline(transaction=False)
        queued = queue(pipe)
        if asyncio.iscoroutine(queued):  # a redis-py Script called with client=pipe queues via a coroutine
            await queued
        if self.replicas <= 0 or await self._alone_now(client, node):
            return await pipe.execute()
        pipe.execute_command("WAIT", self.replicas, self.timeout_ms, **_target(node))
        *replies, acked = await pipe.execute(raise_on_error=False)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        if isinstance(acked, Exception):
            if not demoted(acked):
                raise acked
            # The write followed MOVED to the new master but the WAIT went to the old one, a replica
            # now: the write is done (not repeated), the catch-up WAITs on the new map's node.
            await _refresh_slots(client)
            acked = 0
        # A failover during the call: the cluster client re-ran the pipeline elsewhere and the WAIT
        # may not have run where the write landed; the catch-up asks the key's node of now.
        if int(acked) < self.replicas or _moved(client, key, node):
            self.short += 1
            # The write is done: a stale slot map met now (a refresh answered by a node that has not seen
            # the failover yet) is retried on the catch-up alone, never by writing again.
            await _through_failover(client, key, "replica_wait_retry", lambda: self._catch_up(client, key))
        return replies

    async def _catch_up(self, client: Any, key: str) -> None:
        """After a short WAIT: write a marker after ours on the key's node and WAIT for it (WAIT counts
        a connection's own writes, and replicas apply a master's writes in order), until enough replicas
        have it or none is online."""
        started = time.monotonic()
        cluster = _node(client, key) is not None
        marker = touch_key(key, cluster)
        while True:
            node = _node(client, marker)
            if await self._alone_now(client, node, ask=True):
                return
            pipe = client.pipeline(transaction=False)
            pipe.set(marker, 1, px=60_000)
            pipe.execute_command("WAIT", self.replicas, self.timeout_ms, **_target(node))
            _, acked = await pipe.execute()
            if int(acked) >= self.replicas and not _moved(client, marker, node):
                return
            online = online_replicas(await client.info("replication", **_target(node)))
            if online == 0:
                continue  # it went away meanwhile: the next round returns as alone
            if int(acked) >= min(self.replicas, online):
                return  # every online replica has it (fewer are up than broker.wait_replicas asks)
            log.warning(
                "replica_lagging",
                wanted=self.replicas,
                acked=int(acked),
                waited_s=round(time.monotonic() - started, 3),
                reason="the write's reply waits until a replica has it (broker.wait_replicas)",
            )

    async def _alone_now(self, client: Any, node: Any, ask: bool = False) -> bool:
        """True (and the write counted as unreplicated) when `node` has no replica online: known from a
        recent answer, or asked now (`ask`, or the last answer is older than ALONE_RECHECK_S)."""
        name = "" if node is None else node.name
        due = self._alone.get(name)
        if due is None and not ask:
            return False
        if due is None or time.monotonic() >= due:
            info = await client.info("replication", **_target(node))
            if node is not None and info.get("role") not in (None, "master"):
                # a replica has no replicas of its own: that would count the key's writes as alone
                raise StaleTopology(f"{node.name} is a replica now (the slot map predates a failover)")
            if online_replicas(info) > 0:
                self._alone.pop(name, None)
                return False
            if due is None:
                log.warning(
                    "write_unreplicated",
                    node=name or "server",
                    wanted=self.replicas,
                    reason="no replica online: no failover can lose these writes until one syncs",
                )
            self._alone[name] = time.monotonic() + ALONE_RECHECK_S
        self.unreplicated += 1
        return True


async def _through_failover(client: Any, key: str, event: str, call: Callable[[], Awaitable[Any]]) -> Any:
    """`call()`, again after a transient broker error (on a fresh slot map after a demotion), with back-off,
    up to RETRIES times."""
    for attempt in range(RETRIES + 1):
        try:
            return await call()
        except (
            RedisConnectionError,
            RedisTimeoutError,
            RedisClusterException,
            ClusterDownError,
            RuntimeError,
            ResponseError,
            StaleTopology,
        ) as exc:
            if not transient(exc) or attempt == RETRIES:
                raise
            if demoted(exc):
                await _refresh_slots(client)
            log.warning(event, key=key, attempt=attempt + 1, of=RETRIES, error=str(exc)[:200])
            await asyncio.sleep(min(RETRY_CAP_S, RETRY_BASE_S * 2**attempt))
    raise AssertionError("unreachable")


async def _refresh_slots(client: Any) -> None:
    """Reload a cluster client's slot map now (a single server has none)."""
    manager = getattr(client, "nodes_manager", None)
    if manager is not None:
        await manager.initialize()


def _node(client: Any, key: str) -> Any:
    """The cluster node serving `key` now (None: a single server)."""
    find = getattr(client, "get_node_from_key", None)
    return find(key) if find is not None else None


def _target(node: Any) -> dict:
    return {} if node is None else {"target_nodes": node}


def _moved(client: Any, key: str, node: Any) -> bool:
    return node is not None and _node(client, key).name != node.name
