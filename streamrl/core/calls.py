"""Blocking calls run off the event loop, each with a deadline that a hung call cannot outlive.

    calls = Calls("reward")
    value = await calls.run(score, rollout, timeout=5.0)       # raises CallTimeout past 5 s
    results = await calls.map(score, rollouts, timeout=5.0)    # [(True, value) or (False, exception)]

`Calls` runs each blocking call on a daemon thread of its own small pool. A call past its deadline
raises CallTimeout at once and its thread is retired: it is never handed another call and it ends
when the hung call returns; it is never joined, so a call that never returns cannot hold up a stop
or the interpreter's exit, nor take a slot from later calls (asyncio's default executor does all
three: `wait_for(to_thread(...))` leaves the call running on a pool thread that exit waits for).
The annotator loop (streamrl/annotate/annotator.py), the SDK and the env worker run their user code on it.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Any, Callable


class CallTimeout(Exception):
    """A call ran past its deadline (its thread was retired; the call may still be running)."""


class _Thread:
    """A daemon thread that runs one job at a time from its queue; None ends it."""

    def __init__(self, name: str):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, daemon=True, name=name)
        self.thread.start()

    def _loop(self) -> None:
        while (job := self.jobs.get()) is not None:
            job()


class _Map:
    """Thread side of `Calls.map`: calls fn on items[first:] in order, waking the loop once at the end."""

    def __init__(self, fn: Callable, items: list, first: int, results: list):
        self.fn, self.items, self.results = fn, items, results
        self.current = (first, time.monotonic())
        self.first = first
        self.abandoned = False
        self.loop = asyncio.get_running_loop()
        self.finished = self.loop.create_future()

    def __call__(self) -> None:
        for i in range(self.first, len(self.items)):
            self.current = (i, time.monotonic())
            try:
                result: tuple = (True, self.fn(self.items[i]))
            except Exception as exc:  # the caller decides what a failed call means
                result = (False, exc)
            if self.abandoned:  # this call hung past its deadline: the loop has moved on
                return
            self.results[i] = result
        try:
            self.loop.call_soon_threadsafe(_set_done, self.finished)
        except RuntimeError:  # the event loop closed meanwhile
            pass


def _set_done(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class Calls:
    """A small pool of daemon threads for blocking calls, each call bounded by its own deadline."""

    def __init__(self, name: str = "call"):
        self.name = name
        self.idle: list[_Thread] = []
        self.retired: list[_Thread] = []
        """Threads whose call timed out; each ends when its call returns."""
        self.timeouts = 0

    def _take(self) -> _Thread:
        return self.idle.pop() if self.idle else _Thread(f"{self.name}-{len(self.retired) + 1}")

    def hung(self) -> int:
        """Retired threads whose call has not returned yet."""
        self.retired = [t for t in self.retired if t.thread.is_alive()]
        return len(self.retired)

    async def map(self, fn: Callable, items: list, timeout: float | None = None) -> list[tuple[bool, Any]]:
        """[(True, fn(item)) or (False, exception)] per item, each call bounded by `timeout` s (a
        CallTimeout in its place); the items run in order on one thread, with one wake-up of the
        event loop per batch. After a hung call, the rest go on on another thread."""
        results: list = [None] * len(items)
        nxt = 0
        while nxt < len(items):
            worker = self._take()
            job = _Map(fn, items, nxt, results)
            worker.jobs.put(job)
            while True:
                i, started = job.current
                wait = None if timeout is None else max(started + timeout - time.monotonic(), 0)
                try:
                    await asyncio.wait([job.finished], timeout=wait)
                except asyncio.CancelledError:  # the caller stopped waiting: the thread ends after this job
                    job.abandoned = True
                    worker.jobs.put(None)
                    raise
                if job.finished.done():
                    self.idle.append(worker)
                    nxt = len(items)
                    break
                if job.current[0] == i and time.monotonic() - job.current[1] >= timeout:  # item i hangs
                    job.abandoned = True
                    worker.jobs.put(None)  # ends once the hung call returns
                    self.retired.append(worker)
                    self.timeouts += 1
                    results[i] = (False, CallTimeout(f"timed out after {timeout}s"))
                    nxt = i + 1
                    break
        return results

    async def run(self, fn: Callable, *args, timeout: float | None = None) -> Any:
        """fn(*args) on a pool thread; raises its exception, or CallTimeout past `timeout` s."""
        ((ok, value),) = await self.map(lambda _: fn(*args), [None], timeout)
        if not ok:
            raise value
        return value

    def close(self) -> None:
        """End the idle threads; retired ones end when their calls return (they are daemons)."""
        for worker in self.idle:
            worker.jobs.put(None)
        self.idle.clear()
