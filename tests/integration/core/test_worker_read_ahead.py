"""Worker.read over two streams of one consumer group (the assembler's rollouts + annotations): one
blocking XREADGROUP covers both, so an entry on one stream never waits out a block on the other.

    pytest tests/integration/core/test_worker_read_ahead.py
"""

from __future__ import annotations

import time

import pytest

from streamrl.config.schema import BrokerConfig
from streamrl.core.broker import Keys
from streamrl.core.messages import Control, encode
from streamrl.core.worker import Worker

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


async def test_entry_on_the_other_stream_ends_the_block_and_is_kept(broker, config, run_name):
    cfg = config.model_copy(update={"broker": BrokerConfig(url=config.broker.url, block_ms=3000)})
    a, b = Keys(run_name).rollouts, Keys(run_name).annotations
    w = Worker(cfg, broker, "trainer-0")
    for i, s in enumerate((a, b)):  # one entry each takes both streams past the own-pending phase
        await broker.ensure_group(s, "trainer")
        await broker.add(s, encode(Control(action="stop", version=i)))
        got = await w.read(s, "trainer", count=10)
        assert [m.version for _, m in got] == [i]
        await broker.ack(s, "trainer", [e.id for e, _ in got])
    msg = encode(Control(action="weights", version=4))
    await broker.add(b, msg)
    t0 = time.monotonic()
    assert await w.read(a, "trainer", count=10) == []  # woken by stream b's entry, not after 3 s
    assert time.monotonic() - t0 < 1.5
    got = await w.read(b, "trainer", count=10)  # the read-ahead entry, delivered once
    assert [m.version for _, m in got] == [4]
    pending = await broker.client.xpending(b, "trainer")
    assert pending["pending"] == 1  # delivered, not acked: a crash still leaves it claimable
    await broker.add(a, msg)
    assert [m.version for _, m in await w.read(a, "trainer", count=10)] == [4]
