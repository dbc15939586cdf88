"""A job where nothing can be trained stops, saying why: the assembler counts the groups that failed in a row.

streak = FailureStreak(cfg)              # in the assembler
streak.failed("reward: reward function raised ValueError: boom")   # FatalError once a bound is hit
streak.ok()                              # a group completed with usable annotations
streak.step = version                    # the trainer's version (the message names the streak's first)
await GeneratorFailures(broker, keys, streak).read()   # the groups the generators gave up, into the streak

Two bounds, whichever comes first. A count (rollout.max_consecutive_failed_groups): right for failures
that come fast (a reward function that raises, an env that raises). A time, for failures that each
take a timeout to show (a hung env step): they come one round of in-flight groups per timeout, so a
count would take (count / groups in flight) timeouts, minutes where the timeout is 10 s. With env.fn
set, a streak of nothing but timeouts that lasts env.step_timeout_s more (the next round timed out
too) stops the job; rollout.max_failing_s, when set, is that time for a streak of any failures.
"""

from __future__ import annotations

import re
import time

from streamrl.config.schema import Config
from streamrl.core.errors import FatalError

_TIMEOUT = re.compile(r"timed out after|no observation for turn \d+ within")
"""A failure that took a timeout to show (workers/env.py, workers/reward.py, streamrl/generate/env_channel.py)."""
_EPISODE = re.compile(r"^episode (\S+) turn (\d+): (.*)$", re.S)
"""An env failure's reason (the env worker's and the generator's dead letters): `episode ID turn N: what`."""


class FailureStreak:
    """Groups that failed in a row; past a bound (count or time) the job cannot train."""

    def __init__(self, cfg: Config):
        self.bound = cfg.rollout.max_consecutive_failed_groups
        self.window_s = cfg.rollout.failing_window_s(cfg.env)
        self.any_cause = cfg.rollout.max_failing_s is not None
        """Set explicitly, the time bound applies to every failure; by default (env.step_timeout_s) only
        to a streak of timeouts: other failures come fast, and the count is their bound."""
        capacity = cfg.generator.count * cfg.generator.max_inflight_groups or cfg.rollout.groups_per_step
        self.min_groups = min(cfg.rollout.groups_per_step, capacity, self.bound or capacity)
        """The time bound needs this many failed groups too (as many as a step trains, or as the
        generators hold at once): a flaky job's few slow groups failing in a row do not stop it.
        A streak of timeouts needs two: they come one round of steps per timeout, with as few groups
        a round as the env workers take steps at once over a group's size (a group's episodes send
        their steps together), so two rounds of them are the signal."""
        self.reward_fn = cfg.reward.fn
        self.on_error = cfg.reward.on_error
        self.env_fn = cfg.env.fn
        self.step = 0
        """The trainer's version now (the assembler sets it); the streak's first failure records it."""
        self.count = 0
        self.first = ""
        """The error of the streak's first group (what to show: later ones are usually the same)."""
        self.since = 0.0
        self.since_step = 0
        self.timeouts_only = True
        """Every failure of the streak so far was a timeout (an env step, an observation, a reward call)."""

    def ok(self) -> None:
        self.count, self.first = 0, ""

    def failed(self, reason: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.count += 1
        if self.count == 1:
            self.first, self.since, self.since_step, self.timeouts_only = reason, now, self.step, True
        self.timeouts_only = self.timeouts_only and _TIMEOUT.search(reason) is not None
        if self.bound is not None and self.count >= self.bound:
            raise FatalError(self.message())
        if self.window_s is None or now - self.since < self.window_s:
            return
        if (self.timeouts_only and self.count >= 2) or (self.any_cause and self.count >= self.min_groups):
            raise FatalError(self.timed_message(now - self.since))

    def _fix(self) -> str:
        if self.first.startswith("reward"):
            alt = (
                ""
                if self.on_error == "score"
                else "; or set reward.on_error=score to train failing rollouts with reward.error_value"
            )
            return f"fix the reward function (reward.fn={self.reward_fn}){alt}"
        if "env step timed out" in self.first:
            return f"raise env.step_timeout_s or fix the env (env.fn={self.env_fn}): its step does not return"
        if _EPISODE.match(self.first):
            return f"fix the env (env.fn={self.env_fn})"
        return "fix what the error names"

    def message(self) -> str:
        return (
            f"nothing can be trained: {self.count} groups in a row failed "
            f"(rollout.max_consecutive_failed_groups={self.bound}); the first one: {self.first}. "
            f"To go on, {self._fix()}"
        )

    def timed_message(self, lasted_s: float) -> str:
        """`what failed (episode X, turn N): every group since step S failed (...); the fix`."""
        what = self.first
        if m := _EPISODE.match(what):
            what = f"{m.group(3)} (episode {m.group(1)}, turn {m.group(2)})"
        return (
            f"{what}: every group since step {self.since_step} failed ({self.count} groups in {lasted_s:.0f}s, "
            f"none completed; {'rollout.max_failing_s' if self.any_cause else 'env.step_timeout_s'}={self.window_s:g}); "
            f"{self._fix()}"
        )


class GeneratorFailures:
    """Groups the generators gave up (streamrl.core.accounting.fail_group) never reach the assembler's
    streams: they count in the streak from the broker's stats:groups_failed, with the last failure's reason."""

    def __init__(self, broker, keys, streak: FailureStreak):
        self.broker, self.keys, self.streak = broker, keys, streak
        self._seen: int | None = None
        """stats:groups_failed when last read (None: not yet; what a resumed run counted before is not a streak)."""
        self._read_at = 0.0

    async def read(self, every_s: float = 1.0) -> None:
        """Count the groups failed since the last read (at most every `every_s`); FatalError past a bound."""
        if time.monotonic() - self._read_at < every_s:
            return
        self._read_at = time.monotonic()
        total = int(await self.broker.get(self.keys.stat("groups_failed")) or 0)
        seen = total if self._seen is None else self._seen
        new, self._seen = total - seen, total
        if new <= 0:
            return
        reason = (await self.broker.get(self.keys.last_group_failure) or b"a generator gave the group up").decode(
            errors="replace"
        )
        for _ in range(new):
            self.streak.failed(reason)
