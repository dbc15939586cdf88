"""The suite cannot hang: a test whose task ignores cancellation ends the session (stacks, exit code 1)
shortly after its timeout, and its async fixtures' redis-server is stopped on the way out.

The inner session runs this repository's tests/conftest.py on a test that reproduces issue 11's hang:
the test fails by timeout while anyio's runner task still waits on it, so the `broker` fixture's
teardown (queued behind it) would wait forever.

    pytest tests/integration/suite/test_suite_watchdog.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[3]
HUNG_TEST = """
import asyncio
import pytest

pytestmark = pytest.mark.anyio


async def ignores_cancel():
    while True:
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            pass


@pytest.mark.timeout(2)
async def test_hangs(broker):
    await asyncio.wait_for(ignores_cancel(), 0.2)


async def test_never_reached(broker):
    pass
"""


def test_a_hung_async_test_ends_the_session(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", tests / "conftest.py")
    (tests / "test_hung.py").write_text(HUNG_TEST)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "STREAMRL_TEST_HANG_GRACE_S": "3"}
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "base"), "tests"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    elapsed = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "test_hung.py::test_hangs: setup + call + teardown still running after 5 s" in out, out
    assert "in ignores_cancel" in out, out  # the task stacks name the culprit
    assert "test_never_reached" not in out, out
    assert elapsed < 60, f"the session took {elapsed:.0f} s to end"
    logs = list((tmp_path / "base").rglob("redis.log"))
    assert logs and "ready to exit" in logs[0].read_text(), "the session's redis-server was not shut down"
