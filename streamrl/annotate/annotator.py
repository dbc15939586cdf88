"""One annotator loop for every role that reads `rollouts` and writes one annotation per rollout
(the reward worker, the reference worker, an SDK producer), and one way to run their blocking
calls off the event loop with a timeout.

    class MyScorer(Annotator):
        key, group = "judge", "judge"
        async def annotate(self, rollouts):           # [(value, error)] or [(value, error, parts)]
            return [(await self.calls.run(score, r, timeout=5.0), "") for r in rollouts]

`Calls` runs each blocking call on a daemon thread of its own small pool. A call past its deadline
raises CallTimeout at once and its thread is retired: it is never handed another call and it ends
when the hung call returns; it is never joined, so a call that never returns cannot hold up a stop
or the interpreter's exit, nor take a slot from later calls (asyncio's default executor does all
three: `wait_for(to_thread(...))` leaves the call running on a pool thread that exit waits for).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Any, Callable

from streamrl.core.broker import Entry
from streamrl.core.messages import Annotation, Rollout, encode
from streamrl.core.worker import Worker


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


class Annotator(Worker):
    """The loop: read a batch of `rollouts` with consumer group `group`, drop what `skip` names
    (acked, no annotation), `annotate` the rest, write one `key` annotation per rollout (errors are
    dead-lettered as well), then ack."""

    key: str = ""
    group: str = ""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = Calls(self.role)

    def batch_size(self) -> int:
        return 64

    def skip(self, rollout: Rollout) -> bool:
        return False

    async def annotate(self, rollouts: list[Rollout]) -> list[tuple]:
        """[(value, error)] or [(value, error, parts)] per rollout, in order."""
        raise NotImplementedError

    async def step(self) -> bool:
        # One partition per step (streamrl.core.broker.Keys): its batch is published and acked in one
        # call; the read blocks on every partition, so entries of the others are ready for the next steps.
        stream = self.consumer.pick(self.keys.rollout_streams)
        items = await self.read(stream, self.group, count=self.batch_size(), expect=Rollout)
        if not items:
            return False
        if skipped := [e.id for e, r in items if self.skip(r)]:
            await self.broker.ack(stream, self.group, skipped)
            items = [(e, r) for e, r in items if not self.skip(r)]
            if not items:
                return True
        results = await self.annotate([r for _, r in items])
        await self.publish(items, results, stream)
        return True

    def dead_letter_reason(self, error: str) -> str:
        return error

    async def publish(self, items: list[tuple[Entry, Rollout]], results: list, stream: str) -> None:
        """Write one `key` annotation per (entry, rollout) from `results` [(value, error)] or
        [(value, error, parts)], dead-letter the rollouts that failed (their annotation carries the
        error), then ack the batch. `stream`: the rollouts partition the batch was read from; the
        annotations go to the same partition."""
        out = []
        for (entry, r), (value, error, *parts) in zip(items, results, strict=True):
            if error:
                await self.dead_letter(stream, entry, self.dead_letter_reason(error))
            out.append(
                encode(
                    Annotation(
                        rollout_id=r.rollout_id,
                        key=self.key,
                        value=value,
                        producer=self.worker_id,
                        error=error,
                        parts=parts[0] if parts else {},
                    )
                )
            )
        ids = [e.id for e, _ in items]
        annotations = self.keys.annotation_streams[self.keys.rollout_streams.index(stream)]
        await self.broker.add_and_ack(annotations, out, stream, self.group, ids)
        self.count("scored", len(items))

    async def close(self) -> None:
        self.calls.close()
