"""A per-test watchdog: end the session (stacks, exit code 1) when a test's setup + call + teardown
outlast its timeout by HANG_GRACE_S, so the suite fails fast instead of hanging.

pytest-timeout's `signal` method fails a test once and is not re-armed, and anyio runs every async test
and fixture in one runner task: a test whose task ignores the cancel keeps that task busy, so the
teardown of its async fixtures (and every later async test) waits on it forever (issue 11: `make test`
sat 17 minutes in the `broker` fixture's teardown). Its hook is imported into tests/conftest.py.
"""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import os
import sys
import threading

import pytest

HANG_GRACE_S = float(os.environ.get("STREAMRL_TEST_HANG_GRACE_S", "60"))
"""How long past its timeout a test (setup, call and teardown) may still run before the session ends;
STREAMRL_TEST_HANG_GRACE_S overrides it (tests/integration/suite/test_suite_watchdog.py uses a short one)."""

servers: list = []
"""The session's brokers.embedded.EmbeddedRedis servers, stopped before the process ends (none is orphaned)."""


def _test_timeout(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.args[0] if marker.args else marker.kwargs.get("timeout")
    else:
        value = item.config.getoption("timeout", None)
        value = item.config.getini("timeout") if value is None else value
    return float(value or 0)


def _end_hung_session(item: pytest.Item, limit_s: float) -> None:
    capman = item.config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        capman.suspend_global_capture(in_=True)
    print(
        f"\n{item.nodeid}: setup + call + teardown still running after {limit_s:.0f} s (its timeout plus "
        f"{HANG_GRACE_S:.0f} s). The per-test timeout could not stop it (a task that ignores cancellation, "
        "or an async fixture teardown queued behind it); ending the session. Stacks of all threads:",
        file=sys.stderr,
        flush=True,
    )
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    print("Unfinished asyncio tasks (innermost await last):", file=sys.stderr, flush=True)
    for line in _task_stacks():
        print(line, file=sys.stderr, flush=True)
    for server in servers:
        try:
            server.stop(timeout=2)
        except Exception as exc:  # the exit below must happen whatever the server does
            print(f"could not stop redis-server on port {server.port}: {exc}", file=sys.stderr, flush=True)
    os._exit(1)


def _task_stacks() -> list[str]:
    """Each pending asyncio task's chain of awaits (a hung test's task is no thread: faulthandler misses it).
    Read from the watchdog thread while the loop idles in select(); best effort, the process ends next."""
    lines = []
    for task in [o for o in gc.get_objects() if isinstance(o, asyncio.Task) and not o.done()]:
        lines.append(f"  {task!r}")
        coro = task.get_coro()
        while coro is not None:
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
            if frame is not None:
                lines.append(f"    {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
            coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return lines


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    timeout = _test_timeout(item)
    if timeout <= 0:
        return (yield)
    timer = threading.Timer(timeout + HANG_GRACE_S, _end_hung_session, (item, timeout + HANG_GRACE_S))
    timer.daemon = True
    timer.start()
    try:
        return (yield)
    finally:
        timer.cancel()
