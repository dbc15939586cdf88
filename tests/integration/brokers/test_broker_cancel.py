"""A cancelled broker call ends with CancelledError at once, whichever event-loop tick the cancel lands on.

On Python 3.11 redis-py's write path (`asyncio.wait_for` around the socket write, used whenever
socket_timeout is set) drops a cancel that lands while its write finishes (CPython gh-86296); a
worker loop cancelled there keeps reading forever. Sweeping the cancel over every tick of a few
round trips hits that window deterministically.

    pytest tests/integration/brokers/test_broker_cancel.py
"""

from __future__ import annotations

import asyncio

import pytest

from streamrl.config.schema import BrokerConfig, Config, RunConfig
from streamrl.core.broker import Keys
from streamrl.core.worker import Worker

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

TICKS = 40
"""Cancel offsets swept (loop iterations after the task starts): more than two round trips' worth."""


async def _cancel_after(coro_fn, ticks: int) -> asyncio.Task:
    task = asyncio.create_task(coro_fn())
    for _ in range(ticks):
        await asyncio.sleep(0)
    task.cancel()
    await asyncio.wait({task}, timeout=1.0)
    return task


async def _sweep(coro_fn) -> list[str]:
    problems = []
    for ticks in range(TICKS):
        task = await _cancel_after(coro_fn, ticks)
        if not task.done():
            problems.append(f"tick {ticks}: still running 1 s after cancel()")
            task.cancel()  # a second cancel ends it (the first one was lost)
            await asyncio.wait({task}, timeout=5.0)
        elif not task.cancelled():
            problems.append(f"tick {ticks}: ended without CancelledError ({task.exception()!r})")
    return problems


async def test_cancelled_blocking_reads_end_promptly(broker, run_name):
    streams = [Keys(run_name).rollouts, Keys(run_name).annotations]
    for s in streams:
        await broker.ensure_group(s, "g")

    async def read_forever():
        while True:
            await broker.read_groups(streams, "g", "c0", count=8, block_ms=20)

    assert await _sweep(read_forever) == []


async def test_cancelled_plain_commands_end_promptly(broker, run_name):
    async def get_forever():
        while True:
            await broker.get(f"{run_name}:missing")

    assert await _sweep(get_forever) == []


async def test_cancelled_worker_read_loop_ends_promptly(broker, redis_server, run_name):
    """The assembler's path (Worker.read on two streams of one group), where the hang was first seen."""

    class Reader(Worker):
        role = "trainer"

    cfg = Config(run=RunConfig(name=run_name), broker=BrokerConfig(url=redis_server.url, block_ms=20))
    w = Reader(cfg, broker, "trainer-0")
    for s in (w.keys.rollouts, w.keys.annotations):
        await broker.ensure_group(s, "trainer")

    async def poll_forever():
        while True:
            await w.read(w.keys.rollouts, "trainer", 64, claim=False)
            await w.read(w.keys.annotations, "trainer", 64, claim=False)

    assert await _sweep(poll_forever) == []


async def test_cancelled_call_leaves_the_connection_usable(broker, run_name):
    """A cancel after the command was sent must not leave its reply for the next command to read."""
    key = f"{run_name}:k"
    await broker.set(key, b"value")

    async def set_forever():
        while True:
            await broker.set(f"{run_name}:other", b"x")

    await _sweep(set_forever)
    for _ in range(50):
        assert await broker.get(key) == b"value"
