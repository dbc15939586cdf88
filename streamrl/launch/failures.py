"""Making failures visible: a job where nothing can be trained stops, and the console shows why.

    streak = FailureStreak(cfg)              # in the assembler
    streak.failed("reward: reward function raised ValueError: boom")   # FatalError once the bound is hit
    streak.ok()                              # a group completed with usable annotations

    watch = DeadLetterWatch(broker_url, run) # in `streamrl up`
    line = watch.poll()                      # "failures: 12 dead-lettered (...); first: ..." or None

The dead-letter stream is the robust source for the console: every role writes a record with
the reason for each entry it gives up on (streamrl.core.worker.Worker.dead_letter), whether or not a
trainer step ever happens.
"""

from __future__ import annotations

import json
import time
from collections import Counter

from streamrl.config.schema import Config
from streamrl.core.broker import Keys
from streamrl.core.broker_url import is_cluster_url, sync_client
from streamrl.core.errors import FatalError


class FailureStreak:
    """Groups that failed in a row; past rollout.max_consecutive_failed_groups the job cannot train."""

    def __init__(self, cfg: Config):
        self.bound = cfg.rollout.max_consecutive_failed_groups
        self.reward_fn = cfg.reward.fn
        self.on_error = cfg.reward.on_error
        self.count = 0
        self.first = ""
        """The error of the streak's first group (what to show: later ones are usually the same)."""

    def ok(self) -> None:
        self.count, self.first = 0, ""

    def failed(self, reason: str) -> None:
        self.count += 1
        self.first = self.first or reason
        if self.bound is not None and self.count >= self.bound:
            raise FatalError(self.message())

    def message(self) -> str:
        fix = (
            f"fix the reward function (reward.fn={self.reward_fn})"
            if self.first.startswith("reward")
            else "fix what the error names"
        )
        alt = (
            ""
            if self.on_error == "score"
            else "; or set reward.on_error=score to train failing rollouts with reward.error_value"
        )
        return (
            f"nothing can be trained: {self.count} groups in a row failed "
            f"(rollout.max_consecutive_failed_groups={self.bound}); the first one: {self.first}. "
            f"To go on, {fix}{alt}"
        )


def cause(reason: str) -> str:
    """A dead-letter reason without its details: 'reward function raised ValueError: boom' -> its type."""
    return reason.split(": ", 1)[0][:100]


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
