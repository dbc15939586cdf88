"""One consumer's side of the consumer-group read protocol: own pending entries first, then idle ones
of dead consumers (XAUTOCLAIM), then new ones (a shared XREADGROUP with read-ahead); decoding with
dead-lettering of bad entries; and the in-progress entries whose idle time is kept fresh.

    consumer = StreamConsumer(broker, cfg.broker, "reward-0", Keys(run), log, count)
    items = await consumer.read(keys.rollouts, "reward", count=64, expect=Rollout)

A Worker (streamrl/core/worker.py) owns one and runs its keepalive; the trainer's assembler
(streamrl/assemble/assembler.py) owns another for the trainer's group.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

from streamrl.config.schema import BrokerConfig
from streamrl.core.broker import Broker, Entry, Keys
from streamrl.core.errors import DecodeError
from streamrl.core.messages import decode_with_extras


class StreamConsumer:
    def __init__(
        self, broker: Broker, cfg: BrokerConfig, name: str, keys: Keys, log, count: Callable[..., None] | None = None
    ):
        """`name` is the consumer name within each group; `count(name, by)` receives `dead_lettered`."""
        self.broker = broker
        self.cfg = cfg
        self.name = name
        self.keys = keys
        self.log = log
        self._count = count or (lambda *_: None)
        self._pending_cursor: dict[str, str | None] = {}
        self._held: dict[tuple[str, str], set[str]] = {}
        self._last_claim: dict[str, float] = {}
        self._group_streams: dict[str, list[str]] = {}
        """Streams this consumer reads with each consumer group (see `read`)."""
        self._read_ahead: dict[str, list[Entry]] = {}
        """New entries delivered by a shared XREADGROUP for a stream not being read at that moment."""
        self.caught_up: dict[str, bool] = {}
        """Per stream: the last `read` asked the broker for new entries and got fewer than it asked
        for, so every entry added before that read has been delivered to this consumer."""
        self._extras_seen: set[tuple[str, str]] = set()
        self._turn: dict[tuple[str, ...], int] = {}

    def pick(self, streams: list[str]) -> str:
        """Which of `streams` (a run's partitions) to read next: one with entries already read ahead,
        else each in turn, so every partition has its own-pending and takeover phases."""
        for stream in streams:
            if self._read_ahead.get(stream):
                return stream
        key = tuple(streams)
        turn = self._turn.get(key, 0)
        self._turn[key] = turn + 1
        return streams[turn % len(streams)]

    # -- entries in progress -------------------------------------------------------------------
    def hold(self, stream: str, group: str, entry_id: str) -> None:
        """Mark an entry as in progress: its idle time is reset periodically until `release`."""
        self._held.setdefault((stream, group), set()).add(entry_id)

    def release(self, stream: str, group: str, entry_id: str) -> None:
        self._held.get((stream, group), set()).discard(entry_id)

    def is_held(self, stream: str, group: str, entry_id: str) -> bool:
        return entry_id in self._held.get((stream, group), ())

    async def touch_held(self) -> None:
        """Reset the idle time of every held entry (so no other consumer claims work in progress)."""
        for (stream, group), ids in list(self._held.items()):
            try:
                await self.broker.touch(stream, group, self.name, sorted(ids))
            except Exception as exc:  # a missed touch only risks a duplicate, which is idempotent
                self.log.warning("keepalive_failed", stream=stream, error=str(exc))

    def rescan(self, *streams: str) -> None:
        """Read these streams' own pending entries again from the start at the next `read` (after a
        broker restart, entries whose XREADGROUP reply was lost are pending on us but were never seen)."""
        for stream in streams:
            self._pending_cursor[stream] = "0"

    # -- bad entries ---------------------------------------------------------------------------
    async def dead_letter(self, stream: str, entry: Entry, reason: str) -> None:
        """Move a bad entry to the dead-letter stream with the reason (the caller acks it)."""
        self._count("dead_lettered")
        self.log.warning("dead_letter", stream=stream, entry_id=entry.id, reason=reason)
        record = {"stream": stream, "entry_id": entry.id, "reason": reason, "worker": self.name, "ts": time.time()}
        payload = json.dumps(record).encode() + b"\n" + (entry.data or b"")
        await self.broker.add(self.keys.deadletter, payload, maxlen=100_000)

    async def decode_entries(
        self,
        stream: str,
        group: str,
        entries: list[Entry],
        expect: type | None = None,
        on_bad: Callable[[Entry, str], None] | None = None,
    ) -> list[tuple[Entry, Any]]:
        """Decode entries; bad ones (or not of type `expect`) are dead-lettered and acked, and handed
        to `on_bad(entry, reason)` (a reader that can tell who waits for one fails that waiter now)."""
        good, bad = [], []
        for entry in entries:
            try:
                if entry.data is None:
                    raise DecodeError(
                        f"entry has no 'd' field (it has {sorted(entry.fields) or 'none'}); every "
                        "entry carries its msgpack payload in one field named d"
                    )
                msg, extras = decode_with_extras(entry.data, expect)
                good.append((entry, msg))
                for name in extras:  # ignored by the schema's rule; said once, it may be a typo
                    if (msg.kind, name) not in self._extras_seen:
                        self._extras_seen.add((msg.kind, name))
                        self.log.warning(
                            "unknown_field_ignored",
                            kind=msg.kind,
                            field=name,
                            stream=stream,
                            entry_id=entry.id,
                            hint="written by a newer writer, or misspelt",
                        )
            except DecodeError as exc:
                await self.dead_letter(stream, entry, str(exc))
                bad.append(entry.id)
                if on_bad is not None:
                    on_bad(entry, str(exc))
        if bad:
            await self.broker.ack(stream, group, bad)
        return good

    # -- reading -------------------------------------------------------------------------------
    async def read(
        self,
        stream: str,
        group: str,
        count: int,
        expect: type | None = None,
        claim: bool = True,
        on_bad: Callable[[Entry, str], None] | None = None,
    ) -> list[tuple[Entry, Any]]:
        """Own pending entries first (after a restart), then idle ones of dead consumers, then new ones.
        `claim=False` skips the idle takeover (a group with a single consumer, e.g. the trainer's).

        A consumer that reads several streams with one group (the assembler: rollouts and annotations)
        blocks on all of them in one XREADGROUP: waiting on one stream while the other has entries
        would add up to broker.block_ms of latency per poll. Entries that arrive for the other
        streams are kept (already delivered, so pending on this consumer) for their next `read`.
        """
        b = self.cfg
        streams = self._group_streams.setdefault(group, [])
        if stream not in streams:
            streams.append(stream)
        self.caught_up[stream] = False
        if ahead := self._read_ahead.get(stream):
            self._read_ahead[stream] = ahead[count:]
            return await self.decode_entries(stream, group, ahead[:count], expect, on_bad)
        cursor = self._pending_cursor.get(stream, "0")
        entries: list[Entry] = []
        if cursor is not None:
            entries = await self.broker.read_group(stream, group, self.name, count=count, block_ms=None, start=cursor)
            self._pending_cursor[stream] = entries[-1].id if entries else None
        now = time.monotonic()
        if claim and not entries and now - self._last_claim.get(stream, 0.0) > b.claim_idle_ms / 4000:
            self._last_claim[stream] = now
            entries = await self.broker.claim_idle(stream, group, self.name, b.claim_idle_ms, count=count)
        if not entries:
            # Only streams past their own-pending phase join: a pending read after a shared one
            # would deliver the read-ahead entries a second time.
            shared = [stream] + [s for s in streams if s != stream and self._pending_cursor.get(s, "0") is None]
            got = await self.broker.read_groups(shared, group, self.name, count=count, block_ms=b.block_ms)
            entries = got.pop(stream, [])
            self.caught_up[stream] = len(entries) < count
            for other, more in got.items():
                self._read_ahead[other] = self._read_ahead.get(other, []) + more
        return await self.decode_entries(stream, group, entries, expect, on_bad)
