"""The Broker protocol on Redis Cluster (or Valkey Cluster), through redis-py's asyncio RedisCluster.

    broker = await connect("redis+cluster://:PW@10.0.0.1:7000,10.0.0.2:7000,10.0.0.3:7000")

Same semantics as RedisBroker (brokers/redis_streams.py), whose code it reuses: each command goes to
the node serving its key's slot. What one command or script touches must live in one slot (Redis
refuses cross-slot access): the run's keys are laid out with hash tags for that
(streamrl.core.broker.Keys, docs/protocol.md "Keys"), and where a call spans slots (the trainer
reading every partition, acks over several partitions) it is split per slot here. A script whose
keys span slots is refused before it is sent, naming the keys.

At connect, every node of the cluster must answer and the cluster must report `cluster_state:ok`:
a job never starts on a degraded cluster (docs/scaling-brokers.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from typing import Any

import redis.asyncio as aioredis
import redis.asyncio.cluster as aiocluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.crc import key_slot
from redis.exceptions import (
    AuthenticationError,
    ClusterDownError,
    NoPermissionError,
    RedisClusterException,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from brokers.acl import cluster_grant_hint
from brokers.redis_streams import RedisBroker, ReplicaWait, _TransientRetry, log
from brokers.replica_wait import transient
from streamrl.core.broker import Entry, Keys
from streamrl.core.broker_url import CLUSTER_FORM, parse_cluster_url, redact_cluster
from streamrl.core.errors import BrokerError

SLOT_POLL_MS = 5
"""A blocking read over several slots waits in slices this long: one node's XREADGROUP cannot be woken by
an entry on another, and a blocked one must not be cancelled (what it delivered would sit pending)."""


FAILOVER_WAIT_S = 30.0
"""How long a command keeps retrying while its node is down: a failover takes cluster-node-timeout plus an
election (seconds); a node down for longer is a lost cluster, and the error reaches the worker."""
FAILOVER_ERRORS = (RedisConnectionError, RedisTimeoutError, ClusterDownError, SlotNotCoveredError, TryAgainError)


class FailoverCluster(aiocluster.RedisCluster):
    """RedisCluster whose commands outlast a failover. redis-py retries a command that hit a dead node at
    once, reloading the slot map each time: its retries are spent within milliseconds, while the map still
    names the dead master, long before its replica is promoted (the trainer died on the first master
    kill). Here each retry waits (doubling from 50 ms to 1 s) until FAILOVER_WAIT_S are up."""

    failover_wait_s = 0.0
    """0 while connect checks the cluster (a node down at start is an error at once), then FAILOVER_WAIT_S."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        delay, deadline = 0.05, time.monotonic() + self.failover_wait_s
        while True:
            try:
                return await super().execute_command(*args, **kwargs)
            except (*FAILOVER_ERRORS, RuntimeError) as exc:
                if not isinstance(exc, FAILOVER_ERRORS) and not transient(exc):
                    raise  # a RuntimeError that is not uvloop's "handler is closed"
                if isinstance(exc, AuthenticationError) or time.monotonic() + delay > deadline:
                    raise
                log.warning("cluster_retry", command=str(args[0]), wait_s=delay, error=str(exc)[:200])
                if isinstance(exc, RuntimeError):  # a connection left half-open: drop the idle ones, reconnect
                    for node in self.get_nodes():
                        with contextlib.suppress(Exception):
                            await node.disconnect_free_connections()
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)
                self._initialize = True  # ask the cluster for its slot map again: the replica may lead now


def slot_of(key: str) -> int:
    return key_slot(key.encode())


def by_slot(keys: list[str]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = defaultdict(list)
    for k in keys:
        out[slot_of(k)].append(k)
    return out


def check_slots(keys: Keys) -> None:
    """Refuse a key layout whose multi-key commands would span slots (Redis Cluster refuses them mid-run)."""
    for group in keys.together():
        if len(by_slot(group)) > 1:
            raise BrokerError(
                f"keys {group} are used together but hash to slots {sorted(by_slot(group))} on a cluster; "
                "build the run's keys for a cluster (Keys(run, partitions, cluster=True), what Keys.of(cfg) "
                "does for broker.url=redis+cluster://...) so they share a hash tag"
            )


class ClusterBroker(RedisBroker):
    """The Broker protocol over one RedisCluster client; multi-key calls split per slot."""

    cluster = True
    """The run's keys need the cluster layout (streamrl.core.broker.Keys(cluster=True))."""

    async def read_groups(
        self, streams: list[str], group: str, consumer: str, count: int = 64, block_ms: int | None = 200
    ) -> dict[str, list[Entry]]:
        slots = list(by_slot(streams).values())
        if len(slots) == 1:
            return await super().read_groups(streams, group, consumer, count, block_ms)
        deadline = time.monotonic() + (block_ms or 0) / 1000
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            slice_ms = None if block_ms is None or left_ms <= 0 else min(SLOT_POLL_MS, left_ms)
            parts = await asyncio.gather(
                *(super(ClusterBroker, self).read_groups(s, group, consumer, count, slice_ms) for s in slots)
            )
            out = {s: e for part in parts for s, e in part.items() if e}
            if out or slice_ms is None:
                return out

    async def ack_many(self, group: str, ids: dict[str, list[str]]) -> int:
        parts = by_slot([s for s, some in ids.items() if some])
        done = await asyncio.gather(
            *(super(ClusterBroker, self).ack_many(group, {s: ids[s] for s in ss}) for ss in parts.values())
        )
        return sum(done)

    async def add_and_ack(
        self, stream: str, items: list[bytes], ack_stream: str, group: str, ids: list[str], maxlen: int | None = None
    ) -> list[str]:
        if slot_of(stream) == slot_of(ack_stream):
            return await super().add_and_ack(stream, items, ack_stream, group, ids, maxlen)
        added = await self.add_many(stream, items, maxlen)  # two slots: the ack strictly after the add
        await self.ack(ack_stream, group, ids)
        return added

    async def script(self, source: str, keys: list[str], args: list) -> Any:
        slots = by_slot(keys)
        if len(slots) > 1:
            raise BrokerError(
                f"a broker script updates {keys} atomically, but on a cluster they hash to slots {sorted(slots)}: "
                "Redis refuses a script across slots. Give these keys one hash tag ({...}); the run's own keys "
                "have one (streamrl.core.broker.Keys built for a cluster: Keys.of(cfg))"
            )
        return await super().script(source, keys, args)

    async def scan(self, pattern: str) -> list[str]:
        # RedisCluster.scan_iter walks every primary; a key lives on one, so no duplicates.
        return sorted({k.decode() if isinstance(k, bytes) else k async for k in self.client.scan_iter(match=pattern)})


async def connect_cluster(
    url: str,
    retries: int = 20,
    backoff_base_s: float = 0.05,
    backoff_cap_s: float = 2.0,
    strict: bool = False,
    durable: ReplicaWait | None = None,
    **client_kwargs: Any,
) -> ClusterBroker:
    """Connect to the cluster named by `url` and check it serves every slot; raise BrokerError naming the fix.

    `strict` (the job's start, streamrl.launch.preflight): also every node of the cluster, replicas
    included, and every seed of the URL must answer, so a job never starts without its failover
    replicas. A role (re)started mid-job connects without it: a master killed and failed over may
    still be down then, and the job goes on without it."""
    shown = redact_cluster(url)
    seeds, user, password = parse_cluster_url(url)
    retry = _TransientRetry(ExponentialBackoff(cap=backoff_cap_s, base=backoff_base_s), retries)
    delay, last = backoff_base_s, "no attempt"
    for attempt in range(retries + 1):
        client = FailoverCluster(
            startup_nodes=[aiocluster.ClusterNode(h, p) for h, p in seeds],
            username=user,
            password=password,
            ssl=url.startswith("rediss+"),
            decode_responses=False,
            retry=retry,
            retry_on_error=[RedisConnectionError, RedisTimeoutError],
            socket_connect_timeout=5.0,
            socket_keepalive=True,
            health_check_interval=30,
            **client_kwargs,
        )
        try:
            await _check_whole(client, seeds, strict)
            client.failover_wait_s = FAILOVER_WAIT_S
            return ClusterBroker(client, url, durable)
        except _Refused as exc:
            await client.aclose()
            raise BrokerError(_noperm_message(shown, user, str(exc))) from None
        except AuthenticationError as exc:
            await client.aclose()
            raise BrokerError(
                f"cluster {shown} rejected the credentials ({exc}); put the right password in the URL ({CLUSTER_FORM})"
            ) from None
        except _NotACluster as exc:
            await client.aclose()
            raise BrokerError(
                f"broker.url={shown} names a Redis Cluster, but {exc} runs without cluster mode "
                "(cluster-enabled no); use redis://:PASSWORD@HOST:PORT/0 for a single server, or point the "
                "URL at the nodes of a cluster (docs/scaling-brokers.md)"
            ) from None
        except BaseException as exc:
            await client.aclose()
            if not isinstance(exc, (RedisError, OSError, _Degraded)):
                raise
            last = str(exc)
        if attempt < retries:
            log.warning("broker_connect_retry", url=shown, attempt=attempt + 1, of=retries, error=last)
            await asyncio.sleep(delay)
            delay = min(delay * 2, backoff_cap_s)
    raise BrokerError(
        f"the cluster at {shown} is not whole after {retries + 1} attempts ({last}); start the nodes that are "
        "down (or wait for their replicas to take over; a node gone for good: `redis-cli --cluster del-node`) "
        "and check `redis-cli --cluster check HOST:PORT`"
    )


def _refusal(exc: BaseException) -> str | None:
    """The NOPERM text behind `exc` (redis-py wraps a refused CLUSTER SLOTS as "cluster mode is not
    enabled", a refused PING as a node down), or None when no ACL refused anything."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, NoPermissionError) or "NOPERM" in str(seen):
            text = str(seen)
            return text[text.index("NOPERM") :] if "NOPERM" in text else f"NOPERM {text}"
        seen = seen.__cause__ or seen.__context__
    return None


def _noperm_message(shown: str, user: str | None, refused: str) -> str:
    who = f"user {user!r}" if user else "the default user"
    return (
        f"cluster {shown}: the broker refused {who} a command every cluster client runs ({refused}). Grant it "
        f"on every node: ACL SETUSER {user or 'default'} {cluster_grant_hint()} (then CONFIG REWRITE or ACL "
        "SAVE), or make the user again with `streamrl producer add` / `streamrl envuser add` and the admin "
        'URL, which grant these on every node (docs/protocol.md, "Access control")'
    )


async def _answers(host: str, port: int, client: aiocluster.RedisCluster) -> bool:
    kwargs = client.connection_kwargs
    probe = aioredis.Redis(
        host=host,
        port=port,
        username=kwargs.get("username"),
        password=kwargs.get("password"),
        socket_connect_timeout=2,
        socket_timeout=2,
        retry=Retry(ExponentialBackoff(), 0),
    )
    try:
        return bool(await probe.ping())
    except (RedisError, OSError):
        return False
    finally:
        await probe.aclose()


class _NotACluster(Exception):
    pass


class _Degraded(Exception):
    pass


class _Refused(Exception):
    """An ACL refused the user a command the connect check (any cluster client) runs: the NOPERM text."""


async def _check_whole(client: aiocluster.RedisCluster, seeds: list[tuple[str, int]], strict: bool) -> None:
    try:
        await _check_nodes(client, seeds, strict)
    except Exception as exc:
        if (refused := _refusal(exc)) is not None:
            raise _Refused(refused) from None
        raise


async def _check_nodes(client: aiocluster.RedisCluster, seeds: list[tuple[str, int]], strict: bool) -> None:
    try:
        await client.initialize()
    except RedisClusterException as exc:
        if "cluster mode is not enabled" in str(exc).lower() or "cluster support disabled" in str(exc).lower():
            raise _NotACluster(", ".join(f"{h}:{p}" for h, p in seeds)) from None
        raise _Degraded(str(exc)) from None
    except ResponseError as exc:
        if "cluster support disabled" in str(exc).lower():
            raise _NotACluster(", ".join(f"{h}:{p}" for h, p in seeds)) from None
        raise
    down = []
    for node in client.get_nodes():  # the masters serving the slots
        try:
            await client.ping(target_nodes=node)
        except NoPermissionError:
            raise
        except (RedisError, OSError) as exc:
            down.append(f"{node.host}:{node.port} ({exc})")
    if strict:
        listed = {(n.host, n.port) for n in client.get_nodes()}
        nodes = await client.cluster_nodes()  # every node the cluster knows, replicas and failed ones too
        for addr in nodes:
            host, _, port = addr.split("@")[0].rpartition(":")
            if port.isdigit() and (host, int(port)) not in listed and not await _answers(host, int(port), client):
                down.append(f"{host}:{port} (a node of the cluster: {nodes[addr].get('flags', '?')})")
        for host, port in seeds:  # a seed the cluster does not name (a hostname, a node of another cluster)
            if (host, port) not in listed and not any(d.startswith(f"{host}:{port} ") for d in down):
                if not await _answers(host, port, client):
                    down.append(f"{host}:{port} (named in broker.url, unreachable)")
    if down:
        raise _Degraded("nodes down: " + "; ".join(down))
    info = await client.cluster_info(target_nodes=aiocluster.RedisCluster.RANDOM)
    state = info.get("cluster_state") if isinstance(info, dict) else None
    if state not in ("ok", b"ok"):
        raise _Degraded(f"cluster_state is {state!r}, not ok")
