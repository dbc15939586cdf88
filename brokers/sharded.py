"""A Broker over several Redis servers: each key lives on one of them, chosen by a stable rule.

    broker = await connect_sharded(["redis://:pw@a:6379/0", "redis://:pw@b:6379/0"],
                                   placement={"rollouts": 0, "annotations": 1})
    await broker.add(Keys("run").rollouts, blob)          # goes to server 0, on every host, every run

When one redis-server is not enough (docs/scaling-brokers.md), the heavy streams are spread
over several: the key's *name* (what follows `streamrl:RUN:`, e.g. `rollouts`, `annotations`)
picks the server through `placement`; a key with a `{tag}` goes to crc32(tag) mod N (Redis
Cluster's hash-tag convention); every other key (counters, heartbeats, weights, control) stays
on server 0, so the server-side scripts that update several of them atomically still see them
together. The rule depends only on the name, the placement and the ordered URL list, so every
process of a job routes alike with no coordination, and a stream's entries, groups and pending
lists stay on one server (Redis Streams semantics are per key).
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections import defaultdict

from brokers.redis_streams import RedisBroker, connect
from streamrl.core.broker import Entry
from streamrl.core.errors import ConfigError

SHARD_POLL_MS = 5
"""Blocking reads across servers wait in slices this long (one server cannot wake another's wait)."""


def key_name(key: str) -> str:
    """The routing name of a key: a `{tag}` if present, else what follows `streamrl:RUN:`."""
    if "{" in key and "}" in key.split("{", 1)[1]:
        return key.split("{", 1)[1].split("}", 1)[0]
    parts = key.split(":", 2)
    return parts[2] if len(parts) == 3 and parts[0] == "streamrl" else key


def shard_of(key: str, shards: int, placement: dict[str, int] | None = None) -> int:
    """Index of the server that holds `key` (pure: the same answer in every process)."""
    name = key_name(key)
    if placement and name in placement:
        return placement[name]
    if "{" in key and "}" in key.split("{", 1)[1]:  # a hash tag
        return zlib.crc32(name.encode()) % shards
    return 0


class ShardedBroker:
    """The Broker protocol over N RedisBrokers; every call goes to the server that holds its key."""

    def __init__(self, brokers: list[RedisBroker], placement: dict[str, int] | None = None):
        if not brokers:
            raise ConfigError("ShardedBroker needs at least one broker URL")
        bad = {k: v for k, v in (placement or {}).items() if not 0 <= v < len(brokers)}
        if bad:
            raise ConfigError(
                f"placement {bad} names servers outside 0..{len(brokers) - 1}; "
                f"list {max(bad.values()) + 1} URLs or fix the placement"
            )
        self.shards = brokers
        self.placement = dict(placement or {})

    def of(self, key: str) -> RedisBroker:
        return self.shards[shard_of(key, len(self.shards), self.placement)]

    # -- streams ---------------------------------------------------------------------------
    async def add(self, stream: str, data: bytes, maxlen: int | None = None) -> str:
        return await self.of(stream).add(stream, data, maxlen)

    async def add_many(self, stream: str, items: list[bytes], maxlen: int | None = None) -> list[str]:
        return await self.of(stream).add_many(stream, items, maxlen)

    async def ensure_group(self, stream: str, group: str, start: str = "0") -> None:
        await self.of(stream).ensure_group(stream, group, start)

    async def read_group(
        self, stream: str, group: str, consumer: str, count: int = 64, block_ms: int | None = 200, start: str = ">"
    ) -> list[Entry]:
        return await self.of(stream).read_group(stream, group, consumer, count, block_ms, start)

    async def read_groups(
        self, streams: list[str], group: str, consumer: str, count: int = 64, block_ms: int | None = 200
    ) -> dict[str, list[Entry]]:
        by_shard: dict[int, list[str]] = defaultdict(list)
        for s in streams:
            by_shard[shard_of(s, len(self.shards), self.placement)].append(s)
        if len(by_shard) == 1:
            ((i, names),) = by_shard.items()
            return await self.shards[i].read_groups(names, group, consumer, count, block_ms)
        # Several servers: a blocking read on one cannot be woken by an entry on another, and a
        # blocked XREADGROUP must not be cancelled (its delivered entries would sit pending until
        # claimed). So: wait on all of them in short slices until something arrives or time is up.
        deadline = time.monotonic() + (block_ms or 0) / 1000
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            slice_ms = None if block_ms is None or left_ms <= 0 else min(SHARD_POLL_MS, left_ms)
            parts = await asyncio.gather(
                *(self.shards[i].read_groups(names, group, consumer, count, slice_ms) for i, names in by_shard.items())
            )
            out = {s: e for part in parts for s, e in part.items() if e}
            if out or slice_ms is None:
                return out

    async def ack(self, stream: str, group: str, ids: list[str]) -> int:
        return await self.of(stream).ack(stream, group, ids)

    async def ack_many(self, group: str, ids: dict[str, list[str]]) -> int:
        by_shard: dict[int, dict[str, list[str]]] = defaultdict(dict)
        for s, some in ids.items():
            by_shard[shard_of(s, len(self.shards), self.placement)][s] = some
        return sum(await asyncio.gather(*(self.shards[i].ack_many(group, part) for i, part in by_shard.items())))

    async def add_and_ack(
        self, stream: str, items: list[bytes], ack_stream: str, group: str, ids: list[str], maxlen: int | None = None
    ) -> list[str]:
        if self.of(stream) is self.of(ack_stream):
            return await self.of(stream).add_and_ack(stream, items, ack_stream, group, ids, maxlen)
        added = await self.add_many(stream, items, maxlen)  # on two servers: the ack strictly after the add
        await self.ack(ack_stream, group, ids)
        return added

    async def touch(self, stream: str, group: str, consumer: str, ids: list[str]) -> None:
        await self.of(stream).touch(stream, group, consumer, ids)

    async def claim_idle(
        self, stream: str, group: str, consumer: str, min_idle_ms: int, count: int = 64
    ) -> list[Entry]:
        return await self.of(stream).claim_idle(stream, group, consumer, min_idle_ms, count)

    async def offer(self, stream: str, group: str, consumer: str, idle_ms: int) -> int:
        return await self.of(stream).offer(stream, group, consumer, idle_ms)

    async def read(self, stream: str, last_id: str = "0", count: int = 100, block_ms: int | None = None) -> list[Entry]:
        return await self.of(stream).read(stream, last_id, count, block_ms)

    async def stream_len(self, stream: str) -> int:
        return await self.of(stream).stream_len(stream)

    async def group_info(self, stream: str) -> list[dict]:
        return await self.of(stream).group_info(stream)

    # -- plain keys ------------------------------------------------------------------------
    async def get(self, key: str) -> bytes | None:
        return await self.of(key).get(key)

    async def set(self, key: str, value: bytes | str | int, ttl_s: float | None = None) -> None:
        await self.of(key).set(key, value, ttl_s)

    async def incr(self, key: str, by: int = 1) -> int:
        return await self.of(key).incr(key, by)

    async def hset(self, key: str, mapping: dict[str, bytes | str | int | float]) -> None:
        await self.of(key).hset(key, mapping)

    async def hgetall(self, key: str) -> dict[str, bytes]:
        return await self.of(key).hgetall(key)

    async def delete(self, *keys: str) -> None:
        by_shard: dict[int, list[str]] = defaultdict(list)
        for k in keys:
            by_shard[shard_of(k, len(self.shards), self.placement)].append(k)
        await asyncio.gather(*(self.shards[i].delete(*ks) for i, ks in by_shard.items()))

    async def scan(self, pattern: str) -> list[str]:
        found = await asyncio.gather(*(b.scan(pattern) for b in self.shards))
        return sorted({k for keys in found for k in keys})

    async def script(self, source: str, keys: list[str], args: list) -> object:
        where = {shard_of(k, len(self.shards), self.placement) for k in keys}
        if len(where) > 1:
            raise ConfigError(
                f"a broker script updates {keys} atomically, but the placement puts them on servers "
                f"{sorted(where)}; place these keys on one server (or leave them out of the placement)"
            )
        return await self.shards[where.pop() if where else 0].script(source, keys, args)

    async def close(self) -> None:
        await asyncio.gather(*(b.close() for b in self.shards))


def parse_placement(text: str) -> dict[str, int]:
    """`rollouts=0,annotations=1` -> {"rollouts": 0, "annotations": 1} (for command-line flags)."""
    out = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, index = item.partition("=")
        if not sep or not index.strip().isdigit():
            raise ConfigError(f"placement item {item!r} is not NAME=INDEX; e.g. rollouts=0,annotations=1")
        out[name.strip()] = int(index)
    return out


async def connect_sharded(
    urls: list[str], placement: dict[str, int] | None = None, **kwargs
) -> ShardedBroker | RedisBroker:
    """Connect to every server (one URL: a plain RedisBroker, nothing routed)."""
    brokers = []
    try:
        for url in urls:
            brokers.append(await connect(url, **kwargs))
    except BaseException:
        await asyncio.gather(*(b.close() for b in brokers))
        raise
    return brokers[0] if len(brokers) == 1 and not placement else ShardedBroker(brokers, placement)
