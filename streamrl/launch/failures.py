"""Making failures visible: the console shows why entries are given up on (a job where nothing can be
trained stops: streamrl/assemble/failure_streak.py).

    watch = DeadLetterWatch(broker_url, run) # in `streamrl up`
    line = watch.poll()                      # "failures: 12 dead-lettered (...); first: ..." or None

The dead-letter stream is the robust source for the console: every role writes a record with
the reason for each entry it gives up on (streamrl.core.worker.Worker.dead_letter), whether or not a
trainer step ever happens.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter

from streamrl.core.broker import Keys
from streamrl.core.broker_url import is_cluster_url, sync_client

CAUSE_CHARS = 100
"""A cause is cut (at a word boundary) past this many characters."""

_IDS = [
    # a rollout or episode id, `{group_id}:{sample}:{nonce}`, quoted or not
    (re.compile(r"'[^'\s]*:\d+:[A-Za-z0-9]{1,32}'|\b[\w.-]+:\d+:[A-Za-z0-9]{1,32}\b"), "<id>"),
    # what names one group, rollout or episode: `group 'g3'`, `rollout_id 'x'`, `episode <id> turn 7`
    (re.compile(r"\b(group|group_id|rollout|rollout_id|episode) ('[^']*'|\S+?)(?=[\s:,;)]|$)"), r"\1 <id>"),
    (re.compile(r"\bturn \d+\b"), "turn N"),
    (re.compile(r"\b\d+-\d+\b"), "<entry>"),  # stream entry ids
]


def _shorten(text: str, limit: int = CAUSE_CHARS) -> str:
    if len(text) <= limit:
        return text
    cut = text[: limit + 1].rsplit(" ", 1)[0] if " " in text[:limit] else text[:limit]
    return cut.rstrip(",;:") + " ..."


def cause(reason: str) -> str:
    """What a dead-letter reason is about, without its details or the ids it names, so that one bug
    is one cause however many entries it hits: 'reward function raised ValueError: boom' -> its
    type; "annotation 'score' from producer 'p' for rollout 'g1:0:ab': value is nan" -> the writer
    and what is wrong ("... for rollout <id>: value is nan"); 'episode g3:7:e7 turn 0: ...' ->
    'episode <id> turn N: ...'. Cut at a word boundary."""
    for pattern, repl in _IDS:
        reason = pattern.sub(repl, reason)
    head, sep, rest = reason.partition(": ")
    if sep and head.startswith(("annotation ", "episode ")):  # who wrote it: the cause is what follows
        head = f"{head}: {rest.split(': ', 1)[0]}"
    return _shorten(head)


def parse_record(payload: bytes) -> dict:
    """The JSON header line of a dead-letter entry (Worker.dead_letter); {} if it is not one."""
    try:
        record = json.loads(payload.split(b"\n", 1)[0])
    except (ValueError, UnicodeDecodeError):
        return {}
    return record if isinstance(record, dict) else {}


class FailureCounts:
    """Dead-letter records counted per cause, and the first one seen."""

    def __init__(self):
        self.by_cause: Counter[str] = Counter()
        self.first: dict | None = None

    def add(self, record: dict) -> None:
        reason = str(record.get("reason", "(no reason)"))
        self.by_cause[cause(reason)] += 1
        self.first = self.first or record

    @property
    def total(self) -> int:
        return sum(self.by_cause.values())

    def line(self) -> str:
        causes = ", ".join(f"{c}: {n:,}" for c, n in self.by_cause.most_common(5))
        more = f", {len(self.by_cause) - 5} more causes" if len(self.by_cause) > 5 else ""
        first = self.first or {}
        return (
            f"failures: {self.total:,} entries dead-lettered ({causes}{more}); first: {first.get('reason')} "
            f"[{first.get('worker', '?')}, {first.get('stream', '?')}]"
        )


class DeadLetterWatch:
    """Reads the run's dead-letter stream incrementally; `poll` returns a console line when there is news."""

    def __init__(self, broker_url: str, run: str, every_s: float = 2.0, quiet_s: float = 10.0):
        self.url = broker_url
        self.key = Keys(run, cluster=is_cluster_url(broker_url)).deadletter
        self.every_s, self.quiet_s = every_s, quiet_s
        """Read at most every `every_s`; after the first line, print at most every `quiet_s`."""
        self.counts = FailureCounts()
        self._last_id = "-"
        self._read_at = 0.0
        self._said_at: float | None = None
        self._said_total = 0
        self._client = None

    def read(self) -> None:
        if self._client is None:
            self._client = sync_client(self.url, socket_timeout=2.0, socket_connect_timeout=2.0)
        while True:
            start = self._last_id if self._last_id == "-" else f"({self._last_id}"
            entries = self._client.xrange(self.key, start, "+", count=1000)
            for entry_id, fields in entries:
                self._last_id = entry_id.decode()
                self.counts.add(parse_record(fields.get(b"d", b"")))
            if len(entries) < 1000:
                return

    def poll(self, force: bool = False) -> str | None:
        now = time.monotonic()
        if not force and now - self._read_at < self.every_s:
            return None
        self._read_at = now
        try:
            self.read()
        except Exception:  # the broker restarting or gone: the console line can wait
            self._client = None
            return None
        if self.counts.total == self._said_total:
            return None
        if not force and self._said_at is not None and now - self._said_at < self.quiet_s:
            return None
        self._said_at, self._said_total = now, self.counts.total
        return self.counts.line()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
