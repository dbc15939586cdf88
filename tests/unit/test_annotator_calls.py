"""streamrl.core.calls.Calls: a hung call times out at its deadline, later calls are not held up,
and the hung call's thread ends once the call returns (nothing joins it, nothing reuses it).

    pytest tests/unit/test_annotator_calls.py
"""

import asyncio
import threading
import time

import pytest

from streamrl.core.calls import Calls, CallTimeout


def _threads(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


def test_a_hung_call_times_out_and_its_thread_ends_when_it_returns():
    release = threading.Event()
    calls = Calls("hungtest")

    async def main():
        t0 = time.monotonic()
        with pytest.raises(CallTimeout, match="timed out after 0.2s"):
            await calls.run(release.wait, 60, timeout=0.2)
        assert time.monotonic() - t0 < 2.0
        assert await calls.run(lambda x: x + 1, 41, timeout=0.2) == 42  # a fresh thread, not the hung one
        assert calls.hung() == 1 and calls.timeouts == 1

    asyncio.run(main())  # returns with the call still hung: the loop's exit does not wait for it
    assert len(_threads("hungtest")) == 2  # the hung one and the idle one
    release.set()
    for t in calls.retired:
        t.thread.join(5)
    assert calls.hung() == 0
    calls.close()
    deadline = time.monotonic() + 5
    while _threads("hungtest") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _threads("hungtest") == []  # no thread left behind


def test_map_fails_only_the_hung_item_and_goes_on():
    release = threading.Event()
    calls = Calls("maptest")

    def fn(x):
        if x == 1:
            release.wait(60)
        if x == 3:
            raise ValueError("bad item")
        return x * 10

    results = asyncio.run(calls.map(fn, [0, 1, 2, 3], timeout=0.3))
    assert results[0] == (True, 0) and results[2] == (True, 20)
    assert not results[1][0] and isinstance(results[1][1], CallTimeout)
    assert not results[3][0] and isinstance(results[3][1], ValueError)
    release.set()
    calls.close()


def test_a_cancelled_wait_ends_the_calls_thread_once_its_call_returns():
    release = threading.Event()
    calls = Calls("canceltest")

    async def main():
        task = asyncio.create_task(calls.run(release.wait, 60))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    release.set()
    deadline = time.monotonic() + 5
    while _threads("canceltest") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _threads("canceltest") == []  # not parked forever waiting for a job that never comes
