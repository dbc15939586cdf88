"""The Redis Streams broker: `streamrl.core.broker.Broker` on redis-py asyncio.

Every entry carries one field, `d` (the msgpack payload); consumer groups give fan-out across
roles and load sharing within one. Connection drops are retried with exponential back-off, so a
broker restart is survived without the worker noticing (beyond a log line).

    broker = await connect_server("redis://:PASSWORD@127.0.0.1:6379/0")   # brokers.connect.connect picks it
    await broker.ensure_group("streamrl:tiny:rollouts", "reward")
    entries = await broker.read_group("streamrl:tiny:rollouts", "reward", "reward-0", count=64)
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
import structlog
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from brokers.redis_scripts import ACK_MANY, ADD_AND_ACK, ADD_MANY, LAG_SCRIPT
from brokers.replica_wait import ReplicaWait
from brokers.urls import UNIX_FORM, client_options
from streamrl.core.broker import Entry
from streamrl.core.broker_url import is_cluster_url, redact_cluster
from streamrl.core.errors import BrokerError

FIELD = b"d"
log = structlog.get_logger("streamrl").bind(component="broker")

# Redis < 7 has no `lag` in XINFO GROUPS; we count it server-side, at most this many entries,
# so a status query never holds the server for long (a capped value is a lower bound).
LAG_COUNT_CAP = 10_000
CLOSE_TIMEOUT_S = 10.0


def redact(url: str) -> str:
    """The URL with its password replaced by `***` (for logs and error messages)."""
    if is_cluster_url(url):
        return redact_cluster(url)
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{parts.netloc.rsplit('@', 1)[1]}"))


class _TransientRetry(Retry):
    """Retry dropped connections and timeouts, never a wrong password (redis-py's AuthenticationError
    subclasses ConnectionError: retrying it would only delay the clear error by the whole schedule)."""

    async def call_with_retry(self, do, fail, is_retryable=None, with_failure_count=False):
        def retryable(exc: Exception) -> bool:
            return not isinstance(exc, AuthenticationError) and (is_retryable is None or is_retryable(exc))

        return await super().call_with_retry(do, fail, retryable, with_failure_count)


class _CancelSafeSend:
    """Mixin for a redis-py asyncio connection class: a cancel that lands while a command is written is
    raised, never dropped.

    With socket_timeout set (redis-py's default is 5 s) the write runs under `asyncio.wait_for`, which on
    Python < 3.12 returns normally when the cancel arrives in the tick the write finishes (CPython
    gh-86296). The cancelled task then carried on: a worker loop never stopped (the assembler's
    `next_batch` under `wait_for` hung; a heartbeat task made `Worker.run`'s shutdown wait forever).
    """

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        task = asyncio.current_task()
        requested = task.cancelling() if task is not None else 0
        await super().send_packed_command(command, check_health)  # type: ignore[misc]
        # A cancel handled below (a timeout's own) is uncancelled again: a higher count is one dropped.
        if task is not None and task.cancelling() > requested:
            # The command is on the wire but its reply will not be read here: drop the connection so
            # the next command on it cannot take that reply for its own.
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            raise asyncio.CancelledError("cancelled while the command was being written")


_CANCEL_SAFE: dict[type, type] = {}


def _cancel_safe(pool: aioredis.ConnectionPool) -> aioredis.ConnectionPool:
    """Make `pool` build cancel-safe connections of the class its URL chose (TCP, TLS or unix socket)."""
    base = pool.connection_class
    if not issubclass(base, _CancelSafeSend):
        pool.connection_class = _CANCEL_SAFE.setdefault(
            base, type(f"CancelSafe{base.__name__}", (_CancelSafeSend, base), {})
        )
    return pool


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _raw_xread(response: Any, **options: Any) -> Any:
    """XREAD/XREADGROUP reply as sent ([[stream, [[id, [field, value, ...]], ...]], ...]): redis-py's own
    callback builds a dict per entry, a measurable share of a consumer's CPU (bench/broker.py)."""
    return response or []


def _entry(entry_id: Any, fields: dict | list | None) -> Entry:
    if isinstance(fields, list):  # a raw reply (see _raw_xread): [field, value, ...]
        if len(fields) == 2 and fields[0] == FIELD:  # every streamrl entry: skip the generic path
            return Entry(id=_s(entry_id), data=fields[1], fields={"d": fields[1]})
        fields = dict(zip(fields[::2], fields[1::2]))
    if fields and len(fields) == 1 and FIELD in fields:  # every streamrl entry: skip the generic path
        data = fields[FIELD]
        return Entry(id=_s(entry_id), data=data, fields={"d": data})
    named = {_s(k): v for k, v in (fields or {}).items()}
    return Entry(id=_s(entry_id), data=named.get("d"), fields=named)


def _is_deleted(raw_id: Any, raw_fields: dict | None) -> bool:
    # XADD needs at least one field, so an entry without fields is one deleted (or trimmed)
    # after it was delivered: its pending record is all that is left.
    return raw_id is None or not raw_fields


def _stream_pairs(resp: Any) -> list[tuple[Any, list]]:
    """XREAD(GROUP) replies as [(stream, entries)] for both RESP2 (list) and RESP3 (dict) shapes."""
    if not resp:
        return []
    return list(resp.items()) if isinstance(resp, dict) else [(s, e) for s, e in resp]


class RedisBroker:
    """The Broker protocol over one redis-py asyncio client (a connection pool)."""

    cluster = False

    def __init__(self, client: aioredis.Redis, url: str = "redis://", durable: ReplicaWait | None = None):
        self.client = client
        self.durable = durable or ReplicaWait()
        """Entries, scripts (ledger, admission) and untimed keys wait for a replica (broker.wait_replicas)."""
        self.url = redact(url)
        for command in ("XREAD", "XREADGROUP"):  # per client instance: other clients are unaffected
            client.set_response_callback(command, _raw_xread)
        self._scripts: dict[str, Any] = {}
        self._batch_script = True
        """add_many as one script call (False once the server refuses scripts to this user)."""

    # -- streams ---------------------------------------------------------------------------
    async def add(self, stream: str, data: bytes, maxlen: int | None = None) -> str:
        if self.durable.replicas <= 0:
            return _s(await self.client.xadd(stream, {FIELD: data}, maxlen=maxlen, approximate=True))
        [entry_id] = await self.durable.write(
            self.client, stream, lambda pipe: pipe.xadd(stream, {FIELD: data}, maxlen=maxlen, approximate=True)
        )
        return _s(entry_id)

    async def add_many(self, stream: str, items: list[bytes], maxlen: int | None = None) -> list[str]:
        if not items:
            return []
        if self._batch_script:
            try:
                return [_s(i) for i in await self.script(ADD_MANY, [stream], [FIELD, maxlen or "", *items])]
            except NoPermissionError:  # a restricted broker user (an external producer) may not run scripts
                self._batch_script = False

        def queue(pipe) -> None:
            for data in items:
                pipe.xadd(stream, {FIELD: data}, maxlen=maxlen, approximate=True)

        return [_s(i) for i in await self.durable.write(self.client, stream, queue)]

    async def ensure_group(self, stream: str, group: str, start: str = "0") -> None:
        try:
            await self.client.xgroup_create(stream, group, id=start, mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def _xreadgroup(self, streams: dict[str, str], group: str, consumer: str, count: int, block_ms: int | None):
        try:
            return await self.client.xreadgroup(group, consumer, streams, count=count, block=block_ms)
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
        # The group (or its stream) vanished: deleted by hand, FLUSHALL, or a server that lost its
        # data. Recreate it from the stream's start so no surviving entry is skipped.
        log.warning(
            "consumer_group_recreated",
            group=group,
            streams=list(streams),
            reason="consumer group or stream no longer exists (deleted, flushed, or data lost)",
        )
        for stream in streams:
            await self.ensure_group(stream, group)
        return await self.client.xreadgroup(group, consumer, streams, count=count, block=block_ms)

    async def read_group(
        self, stream: str, group: str, consumer: str, count: int = 64, block_ms: int | None = 200, start: str = ">"
    ) -> list[Entry]:
        if start == ">":
            out = await self.read_groups([stream], group, consumer, count=count, block_ms=block_ms)
            return out.get(stream, [])
        # Own pending entries after `start`: skip and ack the ones deleted meanwhile, and keep
        # paging while a whole page was deleted, so a caller's "empty = done" stays true.
        while True:
            resp = await self._xreadgroup({stream: start}, group, consumer, count, None)
            raw = next((e for _, e in _stream_pairs(resp)), [])
            live = [_entry(i, f) for i, f in raw if not _is_deleted(i, f)]
            gone = [_s(i) for i, f in raw if i is not None and _is_deleted(i, f)]
            if gone:
                await self.client.xack(stream, group, *gone)
            if live or len(raw) < count:
                return live
            start = _s(raw[-1][0])

    async def read_groups(
        self, streams: list[str], group: str, consumer: str, count: int = 64, block_ms: int | None = 200
    ) -> dict[str, list[Entry]]:
        resp = await self._xreadgroup({s: ">" for s in streams}, group, consumer, count, block_ms)
        return {_s(s): [_entry(i, f) for i, f in raw if not _is_deleted(i, f)] for s, raw in _stream_pairs(resp)}

    async def ack(self, stream: str, group: str, ids: list[str]) -> int:
        return int(await self.client.xack(stream, group, *ids)) if ids else 0

    async def ack_many(self, group: str, ids: dict[str, list[str]]) -> int:
        streams = [s for s, some in ids.items() if some]
        if not streams:
            return 0
        if len(streams) == 1:
            return await self.ack(streams[0], group, ids[streams[0]])
        if self._batch_script:
            args: list = [group]
            for s in streams:
                args += [len(ids[s]), *ids[s]]
            try:
                return int(await self._script(ACK_MANY, streams, args, durable=False))  # an ack's loss is a redelivery
            except NoPermissionError:
                self._batch_script = False
        return sum([await self.ack(s, group, ids[s]) for s in streams])

    async def add_and_ack(
        self, stream: str, items: list[bytes], ack_stream: str, group: str, ids: list[str], maxlen: int | None = None
    ) -> list[str]:
        if not ids:
            return await self.add_many(stream, items, maxlen)
        if self._batch_script:
            try:
                args = [FIELD, maxlen or "", group, len(ids), *ids, *items]
                # One script on one server: a failover keeps both or neither, so nothing to wait for.
                return [_s(i) for i in await self._script(ADD_AND_ACK, [stream, ack_stream], args, durable=False)]
            except NoPermissionError:
                self._batch_script = False
        added = await self.add_many(stream, items, maxlen)
        await self.ack(ack_stream, group, ids)
        return added

    async def touch(self, stream: str, group: str, consumer: str, ids: list[str]) -> None:
        if ids:
            await self.client.xclaim(stream, group, consumer, 0, list(ids), justid=True)

    async def claim_idle(
        self, stream: str, group: str, consumer: str, min_idle_ms: int, count: int = 64
    ) -> list[Entry]:
        out: list[Entry] = []
        cursor = "0-0"
        while len(out) < count:
            try:
                resp = await self.client.xautoclaim(
                    stream, group, consumer, min_idle_ms, cursor, count=count - len(out)
                )
            except ResponseError as exc:
                if "NOGROUP" in str(exc):
                    return []  # nothing can be pending in a group that does not exist
                raise
            cursor, raw = _s(resp[0]), resp[1]
            out += [_entry(i, f) for i, f in raw if not _is_deleted(i, f)]
            # Redis >= 7 lists the ids of entries deleted meanwhile (already dropped from the
            # group's pending list; the ack is a no-op kept for clarity); Redis 6.2 returns them
            # as nil, without an id, still pending on us.
            deleted = [_s(i) for i in (resp[2] if len(resp) > 2 else [])]
            if deleted:
                await self.client.xack(stream, group, *deleted)
            if any(i is None for i, _ in raw):
                await self._ack_vanished(stream, group, consumer, {e.id for e in out})
            if cursor == "0-0":
                break
        return out

    async def offer(self, stream: str, group: str, consumer: str, idle_ms: int) -> int:
        ids: list[str] = []
        start = "-"
        while True:
            try:
                page = await self.client.xpending_range(stream, group, start, "+", 1000, consumername=consumer)
            except ResponseError as exc:
                if "NOGROUP" in str(exc):
                    return 0
                raise
            ids += [_s(p["message_id"]) for p in page]
            if len(page) < 1000:
                break
            start = "(" + ids[-1]
        for i in range(0, len(ids), 1000):
            await self.client.xclaim(stream, group, consumer, 0, ids[i : i + 1000], idle=idle_ms, justid=True)
        return len(ids)

    async def _ack_vanished(self, stream: str, group: str, consumer: str, keep: set[str]) -> None:
        """Ack entries pending on `consumer` that no longer exist in the stream (Redis 6.2 path)."""
        pending = await self.client.xpending_range(stream, group, "-", "+", 1000, consumername=consumer)
        ids = [_s(p["message_id"]) for p in pending if _s(p["message_id"]) not in keep]
        if not ids:
            return
        pipe = self.client.pipeline(transaction=False)
        for i in ids:
            pipe.xrange(stream, i, i)
        gone = [i for i, found in zip(ids, await pipe.execute()) if not found]
        if gone:
            await self.client.xack(stream, group, *gone)

    async def read(self, stream: str, last_id: str = "0", count: int = 100, block_ms: int | None = None) -> list[Entry]:
        resp = await self.client.xread({stream: last_id}, count=count, block=block_ms)
        return [_entry(i, f) for _, raw in _stream_pairs(resp) for i, f in raw if not _is_deleted(i, f)]

    async def stream_len(self, stream: str) -> int:
        return int(await self.client.xlen(stream))

    async def group_info(self, stream: str) -> list[dict]:
        """Per group: name, consumers, pending, last_delivered_id, lag (None if unknown)."""
        try:
            groups = await self.client.xinfo_groups(stream)
        except ResponseError as exc:
            if "no such key" in str(exc).lower():
                return []
            raise
        out = []
        for g in groups:
            last = _s(g["last-delivered-id"])
            lag = g["lag"] if "lag" in g else await self.client.eval(LAG_SCRIPT, 1, stream, last, LAG_COUNT_CAP)
            out.append(
                {
                    "name": _s(g["name"]),
                    "consumers": int(g["consumers"]),
                    "pending": int(g["pending"]),
                    "last_delivered_id": last,
                    "lag": None if lag is None else int(lag),
                }
            )
        return out

    # -- plain keys ------------------------------------------------------------------------
    async def get(self, key: str) -> bytes | None:
        return await self.client.get(key)

    async def set(self, key: str, value: bytes | str | int, ttl_s: float | None = None) -> None:
        if ttl_s is not None or self.durable.replicas <= 0:  # a key with a TTL (a heartbeat) is soon rewritten
            await self.client.set(key, value, px=None if ttl_s is None else max(1, int(ttl_s * 1000)))
            return
        await self.durable.write(self.client, key, lambda pipe: pipe.set(key, value))

    async def incr(self, key: str, by: int = 1) -> int:
        return int(await self.client.incrby(key, by))

    async def hset(self, key: str, mapping: dict[str, bytes | str | int | float]) -> None:
        await self.client.hset(key, mapping=mapping)

    async def hgetall(self, key: str) -> dict[str, bytes]:
        return {_s(k): v for k, v in (await self.client.hgetall(key)).items()}

    async def delete(self, *keys: str) -> None:
        if keys:
            await self.client.delete(*keys)

    async def scan(self, pattern: str) -> list[str]:
        return [_s(k) async for k in self.client.scan_iter(match=pattern, count=1000)]

    async def script(self, source: str, keys: list[str], args: list) -> Any:
        # Every caller's script writes what is acted on (the ledger, admission): it waits for a replica.
        return await self._script(source, keys, args, durable=True)

    async def _script(self, source: str, keys: list[str], args: list, durable: bool) -> Any:
        # EVALSHA after the first call (redis-py caches the sha); NOSCRIPT after a server restart
        # is handled by redis-py re-sending the source.
        if source not in self._scripts:
            self._scripts[source] = self.client.register_script(source)
        if not durable or self.durable.replicas <= 0:
            return await self._scripts[source](keys=keys, args=args)
        if self.cluster:  # redis-py refuses EVALSHA in a cluster pipeline; EVAL (the server caches it by sha)
            queue = lambda pipe: pipe.eval(source, len(keys), *keys, *args)  # noqa: E731
        else:
            queue = lambda pipe: self._scripts[source](keys=keys, args=args, client=pipe)  # noqa: E731
        [reply] = await self.durable.write(self.client, keys[0] if keys else "", queue)
        return reply

    async def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Disconnect every connection; give up after `timeout_s` (a shutdown path must not hang on it)."""
        try:
            async with asyncio.timeout(timeout_s):
                await self.client.aclose()
        except TimeoutError:
            log.warning(
                "broker_close_timeout",
                url=self.url,
                timeout_s=timeout_s,
                reason="connections did not close in time; they are dropped with the process",
            )


async def connect_server(
    url: str,
    retries: int = 20,
    backoff_base_s: float = 0.05,
    backoff_cap_s: float = 2.0,
    durable: ReplicaWait | None = None,
    **client_kwargs: Any,
) -> RedisBroker:
    """Connect and ping, retrying with exponential back-off; raise BrokerError when it gives up.
    `durable`: wait for replicas after the writes that matter (ReplicaWait; default off).

    The client itself retries dropped connections (same back-off, `retries` times per command),
    so a broker that restarts under a running worker costs a pause, not a crash.
    """
    shown = redact(url)
    retry = _TransientRetry(ExponentialBackoff(cap=backoff_cap_s, base=backoff_base_s), retries)
    options = {
        "decode_responses": False,
        "retry": retry,
        "socket_connect_timeout": 5.0,
        "socket_keepalive": True,
        "health_check_interval": 30,
        **client_kwargs,
    }
    kwargs = client_options(url, shown, options)  # a unix:// URL: checked, without the TCP-only options
    try:
        # A blocking pool makes a burst of concurrent commands (a generator publishing hundreds of
        # completions at once) wait for a free connection instead of failing with MaxConnectionsError.
        pool = _cancel_safe(aioredis.BlockingConnectionPool.from_url(url, max_connections=64, timeout=60, **kwargs))
        client = aioredis.Redis(
            connection_pool=pool, retry=retry, retry_on_error=[RedisConnectionError, RedisTimeoutError]
        )
    except ValueError as exc:
        raise BrokerError(
            f"broker URL {shown} is malformed ({exc}); use redis://:PASSWORD@HOST:6379/0 or {UNIX_FORM}"
        ) from None
    # The client's own retry would make each ping attempt wait out a whole schedule; a separate
    # probe pings with one attempt each, so every retry is logged here.
    probe = aioredis.Redis.from_url(url, **{**kwargs, "retry": Retry(ExponentialBackoff(), 0)})
    _cancel_safe(probe.connection_pool)
    try:
        await _ping_until_up(probe, shown, retries, backoff_base_s, backoff_cap_s)
    except BaseException:
        await client.aclose()
        raise
    finally:
        await probe.aclose()
    return RedisBroker(client, url, durable)


async def _ping_until_up(probe: aioredis.Redis, shown: str, retries: int, base_s: float, cap_s: float) -> None:
    delay, last_error = base_s, None
    for attempt in range(retries + 1):
        try:
            await probe.ping()
            return
        except AuthenticationError as exc:
            raise BrokerError(
                f"broker {shown} rejected the credentials ({exc}); put the right password in the URL "
                "(redis://:PASSWORD@HOST:PORT/0; an embedded broker writes its URL to the file `url` in its data dir)"
            ) from None
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            last_error = exc
            if attempt == retries:
                break
            log.warning(
                "broker_connect_retry",
                url=shown,
                attempt=attempt + 1,
                of=retries,
                wait_s=round(delay, 3),
                error=str(exc),
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, cap_s)
    raise BrokerError(
        f"cannot reach the broker at {shown} after {retries + 1} attempts ({last_error}); start redis-server "
        "there, check the host/port (or socket path) in broker.url, or set broker.url=embedded to run a private one"
    )
