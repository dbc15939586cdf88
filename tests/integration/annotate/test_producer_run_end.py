"""An external producer (`streamrl reward`, under its restricted broker user) learns that its run
ended and exits by itself with one line; SIGTERM on a broker that is gone is one line too; `streamrl
up`'s exit marks the end and waits for the producers to leave. Real redis-server, real processes.

    pytest tests/integration/annotate/test_producer_run_end.py
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from brokers.connect import connect
from brokers.embedded import EmbeddedRedis
from streamrl.core import run_end
from streamrl.core.broker import Keys
from tests.integration.annotate.test_producers import annotations, producer_add, publish, reward_cli

pytestmark = pytest.mark.anyio
EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "python"


class Producer:
    """`streamrl reward` as a user runs it, its console lines timestamped as they arrive."""

    def __init__(self, url: str, run: str, *extra: str):
        self.proc = reward_cli("length_judge:judge", run, url, "judge-0", *extra, cwd=EXAMPLES)
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"still running {timeout}s later:\n" + self.text()) from None
        self._reader.join(5)
        return code

    def text(self, since: float = 0.0) -> str:
        return "\n".join(ln for t, ln in self.lines if t >= since)

    def since(self, t: float) -> list[str]:
        return [ln for ts, ln in self.lines if ts >= t]


async def test_a_producer_exits_by_itself_with_one_line_when_its_run_ends(redis_server, broker, run_name):
    keys = Keys(run_name)
    url = producer_add(redis_server.url, run_name, "judge")  # the restricted user: the end mark is in its grant
    await publish(broker, keys, 8, garbage=False)
    p = Producer(url, run_name)
    try:
        await annotations(broker, keys, 8, timeout=60)
        t_end = time.time()
        await run_end.mark_ended(broker, keys, "trainer finished", version=7)
        code = await asyncio.to_thread(p.wait, 15)
    finally:
        if p.proc.poll() is None:
            p.proc.kill()
    after = p.since(t_end)
    assert code == 0, p.text()
    assert time.time() - t_end < 10
    assert len(after) == 1 and "stopped" in after[0], after
    assert f"run {run_name} ended: trainer finished (version 7)" in after[0] and "scored=8" in after[0], after
    assert "Traceback" not in p.text()


async def test_sigterm_on_a_broker_that_is_gone_is_one_line(tmp_path, run_name):
    server = EmbeddedRedis(tmp_path / "broker").start()  # stands for the one `streamrl up` ran
    try:
        b = await connect(server.url, retries=3)
        await publish(b, Keys(run_name), 4, garbage=False)
        p = Producer(server.url, run_name)
        await annotations(b, Keys(run_name), 4, timeout=60)
        await b.close()
    finally:
        server.stop()  # the job is gone without a word (e.g. its host died)
    await asyncio.sleep(1.0)  # the producer is now retrying against nothing
    t_term = time.time()
    p.proc.send_signal(signal.SIGTERM)
    code = await asyncio.to_thread(p.wait, 15)
    after = p.since(t_term)
    assert time.time() - t_term < 10, after
    assert code == 0 and len(after) == 1 and "stopped" in after[0] and "reason=SIGTERM" in after[0], p.text()
    assert "Traceback" not in p.text()


async def test_a_producer_whose_broker_stays_unreachable_exits_by_itself(tmp_path, run_name):
    server = EmbeddedRedis(tmp_path / "broker").start()
    try:
        b = await connect(server.url, retries=3)
        await b.ensure_group(Keys(run_name).rollouts, "judge")
        await b.close()
        p = Producer(server.url, run_name, "--connect-retries", "3")
        deadline = time.time() + 60
        while "started" not in p.text() and time.time() < deadline:
            await asyncio.sleep(0.1)
    finally:
        t_gone = time.time()
        server.stop()
    code = await asyncio.to_thread(p.wait, 30)
    after = p.since(t_gone)
    assert code == 1 and len(after) == 1 and "broker unreachable" in after[0], p.text()
    assert "Traceback" not in p.text()


async def test_up_marks_the_end_and_waits_for_its_producers_to_leave(redis_server, broker, run_name):
    url = producer_add(redis_server.url, run_name, "judge")
    p = Producer(url, run_name)
    try:
        deadline = time.time() + 60
        while "started" not in p.text() and time.time() < deadline:
            await asyncio.sleep(0.1)
        t0 = time.time()
        await asyncio.to_thread(run_end.end_run, redis_server.url, run_name, "streamrl up exited with code 130")
        waited = time.time() - t0
        users = {c["user"] for c in await broker.client.client_list()}
        assert f"producer-{run_name}-judge" not in users, "end_run returned while the producer was still connected"
        assert waited < run_end.PRODUCERS_LEAVE_S, waited  # it left: end_run did not just time out
        assert p.wait(10) == 0 and "streamrl up exited with code 130" in p.text()
        # up never overwrites the trainer's own reason
        await run_end.mark_ended(broker, Keys(run_name), "trainer finished", version=3)
        await asyncio.to_thread(run_end.end_run, redis_server.url, run_name, "streamrl up exited", 0.0)
        assert (await run_end.ended(broker, Keys(run_name)))["reason"] == "trainer finished"
    finally:
        if p.proc.poll() is None:
            p.proc.kill()
