"""InFlight (streamrl/core/bounded_tasks.py): the bound, the holds, their release however a task ends."""

from __future__ import annotations

import asyncio

import structlog

from streamrl.config.schema import BrokerConfig
from streamrl.core.bounded_tasks import InFlight
from streamrl.core.broker import Keys
from streamrl.core.consumer import StreamConsumer


def _consumer() -> StreamConsumer:
    # hold/release only keep a set: no broker call is made, so none is needed here.
    return StreamConsumer(None, BrokerConfig(), "c-0", Keys("t"), structlog.get_logger())


def test_bound_holds_and_release_on_success_failure_and_cancel():
    async def main():
        consumer = _consumer()
        inflight = InFlight(2, consumer, "s", "g")
        gate = asyncio.Event()

        async def wait_gate():
            await gate.wait()

        async def fail():
            await gate.wait()
            raise RuntimeError("boom")

        done: list[tuple[str, bool]] = []
        inflight.start(
            wait_gate(), hold=["1-0", "1-1"], on_done=lambda t: done.append(("ok", consumer.is_held("s", "g", "1-0")))
        )
        failing = inflight.start(fail(), hold=["2-0"])
        assert len(inflight) == 2 and inflight.free() == 0
        assert "1-1" in inflight and "3-0" not in inflight
        assert consumer.is_held("s", "g", "1-0") and consumer.is_held("s", "g", "2-0")
        # Full: waits (here the whole timeout, nothing ends) and says so.
        assert await inflight.wait_slot(timeout=0.01) is False
        gate.set()
        assert await inflight.wait_slot(timeout=5) is False  # it waited for one to end...
        await asyncio.sleep(0)
        assert await inflight.wait_slot(timeout=5) is True  # ...and now a slot is free at once
        await inflight.drain(timeout=5)
        assert isinstance(failing.exception(), RuntimeError)
        assert done == [("ok", False)], "on_done runs after the entries are released"
        assert not consumer.is_held("s", "g", "2-0") and len(inflight) == 0 and "2-0" not in inflight

        cancelled = inflight.start(asyncio.sleep(60), hold=["4-0"])
        assert await inflight.drain(timeout=0.01) == {cancelled}, "drain returns what still runs"
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        assert not consumer.is_held("s", "g", "4-0") and inflight.free() == 2

    asyncio.run(main())


def test_on_done_may_start_the_work_again():
    """The generator re-runs a failed group from on_done: the new task holds the entry again."""

    async def main():
        consumer = _consumer()
        inflight = InFlight(1, consumer, "s", "g")
        attempts: list[int] = []

        async def group(n: int):
            attempts.append(n)
            if n == 1:
                raise ConnectionError("broker restarting")

        def again(task: asyncio.Task) -> None:
            if task.exception() is not None:
                inflight.start(group(2), hold=["9-0"], on_done=again)

        inflight.start(group(1), hold=["9-0"], on_done=again)
        while inflight:  # the first attempt, then the one its on_done started
            await inflight.drain(timeout=5)
        assert attempts == [1, 2]
        assert not consumer.is_held("s", "g", "9-0") and inflight.free() == 1

    asyncio.run(main())


def test_without_a_consumer_entries_are_tracked_not_held():
    async def main():
        inflight = InFlight(1)
        inflight.start(asyncio.sleep(0), hold=["1-0"])
        assert "1-0" in inflight
        assert not await inflight.drain(timeout=5)
        assert "1-0" not in inflight

    asyncio.run(main())
