"""At most `limit` asyncio tasks in flight, each holding the stream entries it works on until it ends.

    inflight = InFlight(cfg.env.concurrency, consumer, keys.env_steps, "env")
    if not await inflight.wait_slot(timeout=block_s):
        return False                      # full: waited for one to finish, re-check on the next step
    items = await read(count=inflight.free())
    inflight.start(handle(entry), hold=[entry.id])

The generator (prompt groups), the env worker (env steps), the SDK producer (rollout batches) and
bench/sim_workers.py share it. A held entry's idle time is kept fresh by the consumer's keepalive
(streamrl/core/consumer.py), so no other consumer claims it while its task runs; it is released
when the task ends, however it ends, before `on_done` runs (which may start the work again).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Coroutine, Iterable

from streamrl.core.consumer import StreamConsumer


class InFlight:
    def __init__(self, limit: int, consumer: StreamConsumer | None = None, stream: str = "", group: str = ""):
        """`consumer` None: the entries are tracked (`in`) but not held on the broker (bench's simulation)."""
        self.limit = limit
        self.consumer, self.stream, self.group = consumer, stream, group
        self.tasks: set[asyncio.Task] = set()
        self._entries: set[tuple[str, str]] = set()
        """(stream, entry id) held by a running task."""

    def __len__(self) -> int:
        return len(self.tasks)

    def __contains__(self, entry_id: str) -> bool:
        """Whether a running task holds this entry of `stream` (a re-read of our own work in progress)."""
        return (self.stream, entry_id) in self._entries

    def holds(self, stream: str, entry_id: str) -> bool:
        """`in` for an entry of another stream (a worker reading several, e.g. the env worker's own one)."""
        return (stream, entry_id) in self._entries

    def free(self) -> int:
        return self.limit - len(self.tasks)

    async def wait_slot(self, timeout: float | None) -> bool:
        """True when a slot is free now; else wait up to `timeout` for a task to end and return False
        (the caller returns from its step and re-checks, so a stop is seen between waits)."""
        if self.free() > 0:
            return True
        await asyncio.wait(self.tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        return False

    def start(
        self,
        coro: Coroutine[Any, Any, Any],
        hold: Iterable[str] = (),
        on_done: Callable[[asyncio.Task], None] | None = None,
        stream: str | None = None,
    ) -> asyncio.Task:
        """Run `coro` as a task holding the entries `hold` (of `stream`, default the one given at
        construction); `on_done(task)` runs after they are released."""
        ids = [(stream or self.stream, entry_id) for entry_id in hold]
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        for key in ids:
            self._entries.add(key)
            if self.consumer is not None:
                self.consumer.hold(key[0], self.group, key[1])
        task.add_done_callback(lambda t: self._done(t, ids, on_done))
        return task

    def _done(
        self, task: asyncio.Task, ids: list[tuple[str, str]], on_done: Callable[[asyncio.Task], None] | None
    ) -> None:
        self.tasks.discard(task)
        for key in ids:
            self._entries.discard(key)
            if self.consumer is not None:
                self.consumer.release(key[0], self.group, key[1])
        if on_done is not None:
            on_done(task)

    async def drain(self, timeout: float | None) -> set[asyncio.Task]:
        """Wait up to `timeout` for the running tasks; return those still running (not cancelled)."""
        if not self.tasks:
            return set()
        _, late = await asyncio.wait(list(self.tasks), timeout=timeout)
        return late


async def settle_cancelled(tasks: set[asyncio.Task], log, what: str, timeout: float) -> None:
    """Wait (bounded) for cancelled tasks to unwind; one stuck in a vLLM call must not hang the stop."""
    if not tasks:
        return
    _, stuck = await asyncio.wait(tasks, timeout=timeout)
    if stuck:
        log.warning("cancel_stuck", what=what, tasks=len(stuck), waited_s=timeout)
