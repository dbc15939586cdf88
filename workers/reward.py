"""Reward role: score each rollout with the configured function and publish a `reward` annotation.

    streamrl worker reward --config configs/tiny-cpu.yaml --broker redis://... --run tiny

Reads `rollouts` with the consumer group "reward" (workers of this role share the load), writes
Annotation(key="reward") to `annotations`, then acks. A function that raises, hangs past
reward.timeout_s, or returns a non-finite value yields an annotation with `error` set (the
assembler drops that group and the feeder admits a replacement) and a dead-letter record.
"""

from __future__ import annotations

import asyncio
import math
import queue
import threading
import time

from streamrl.messages import Rollout
from streamrl.rewards import make_reward
from streamrl.worker import Worker

GROUP = "reward"


class RewardWorker(Worker):
    role = "reward"

    _scorer: _ScoringThread | None = None

    async def start(self) -> None:
        self.fn = make_reward(self.cfg.reward)
        await self.broker.ensure_group(self.keys.rollouts, GROUP)

    async def _score_all(self, rollouts: list[Rollout]) -> list[tuple]:
        """Score a batch on the scoring thread, with one wake-up of the event loop per batch. A call
        that hangs past reward.timeout_s fails that rollout only: its thread is abandoned (a daemon
        that exits once the call returns) and a fresh one carries on after it."""
        timeout = self.cfg.reward.timeout_s
        results: list[tuple[float, str] | None] = [None] * len(rollouts)
        nxt = 0
        while nxt < len(rollouts):
            if self._scorer is None:
                self._scorer = _ScoringThread(self.fn)
            job = self._scorer.submit(rollouts, nxt, results)
            while not await job.wait(timeout):
                i, started = job.current
                if time.monotonic() - started >= timeout:  # rollout i hangs
                    job.cancelled.set()
                    self._scorer.retire()
                    self._scorer = None
                    results[i] = (0.0, f"reward function timed out after {timeout}s")
                    self.count("reward_timeouts")
                    nxt = i + 1
                    break
            else:
                nxt = len(rollouts)
        return results  # type: ignore[return-value]

    async def close(self) -> None:
        if self._scorer is not None:
            self._scorer.retire()

    async def step(self) -> bool:
        items = await self.read(self.keys.rollouts, GROUP, count=64, expect=Rollout)
        if not items:
            return False
        scores = await self._score_all([msg for _, msg in items])
        await self.publish_annotations(self.keys.rollouts, GROUP, "reward", items, scores)
        return True


class _Job:
    """One batch handed to the scoring thread; `current` is (index, start time) of the call in progress."""

    def __init__(self, rollouts: list[Rollout], first: int, results: list):
        self.rollouts, self.first, self.results = rollouts, first, results
        self.current = (first, time.monotonic())
        self.cancelled = threading.Event()
        self.loop = asyncio.get_running_loop()
        self.finished = self.loop.create_future()

    def run(self, fn) -> None:
        """Thread side: score rollouts[first:] in order into results, then wake the loop once."""
        for i in range(self.first, len(self.rollouts)):
            self.current = (i, time.monotonic())
            r = self.rollouts[i]
            try:
                out = fn(r.prompt_text, r.text, r.meta)
                value, parts = float(out), getattr(out, "parts", {})  # parts: reward.components' scores
                result = (value, "", parts) if math.isfinite(value) else (0.0, f"reward function returned {value}")
            except Exception as exc:  # user code: any exception is that rollout's failure, not ours
                result = (0.0, f"reward function raised {type(exc).__name__}: {exc}")
            if self.cancelled.is_set():  # abandoned while this call hung: the loop has moved on
                return
            self.results[i] = result
        try:
            self.loop.call_soon_threadsafe(_set_done, self.finished)
        except RuntimeError:  # the worker stopped (event loop closed) meanwhile
            pass

    async def wait(self, timeout: float) -> bool:
        """True once the whole job is scored; False when the call in progress has run `timeout` s."""
        remaining = self.current[1] + timeout - time.monotonic()
        if remaining > 0:
            await asyncio.wait([self.finished], timeout=remaining)
        return self.finished.done()


def _set_done(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class _ScoringThread:
    """A daemon thread that runs jobs in order; retired (replaced) when one of its calls hangs."""

    def __init__(self, fn):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, args=(fn,), daemon=True, name="reward-fn").start()

    def _loop(self, fn) -> None:
        while (job := self.jobs.get()) is not None:
            job.run(fn)

    def submit(self, rollouts: list[Rollout], first: int, results: list) -> _Job:
        job = _Job(rollouts, first, results)
        self.jobs.put(job)
        return job

    def retire(self) -> None:
        self.jobs.put(None)  # exits after the job in progress (a hung call: whenever it returns)
