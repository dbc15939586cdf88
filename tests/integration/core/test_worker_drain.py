"""A worker that is stopping keeps its in-progress entries alive while close() finishes them:
another worker of the role must not claim them as idle (it would redo the work) in the meantime.

    pytest tests/integration/core/test_worker_drain.py
"""

from __future__ import annotations

import asyncio

import pytest

from brokers.redis_streams import RedisBroker
from streamrl.config.schema import BrokerConfig
from streamrl.core.messages import Control, encode
from streamrl.core.worker import Worker

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
GROUP = "generator"


class SlowCloser(Worker):
    """Holds one entry and needs `finish_s` in close() to finish it (as a generator drains a group)."""

    role = "generator"
    finish_s = 1.5

    async def step(self) -> bool:
        for entry, _ in await self.read(self.keys.prompts, GROUP, count=1, claim=False):
            self.entry = entry
            self.hold(self.keys.prompts, GROUP, entry.id)
            self.stop()
        return False

    async def close(self) -> None:
        await asyncio.sleep(self.finish_s)
        await self.broker.ack(self.keys.prompts, GROUP, [self.entry.id])
        self.release(self.keys.prompts, GROUP, self.entry.id)


async def test_entries_being_drained_are_not_claimed_by_others(broker, config):
    cfg = config.model_copy(update={"broker": BrokerConfig(url=config.broker.url, claim_idle_ms=300, block_ms=50)})
    w = SlowCloser(cfg, broker, "gen-a")
    await broker.ensure_group(w.keys.prompts, GROUP)
    await broker.add(w.keys.prompts, encode(Control(action="stop")))
    run = asyncio.create_task(w.run())
    claimed = []
    while not run.done():  # another generator's idle takeover, polled through the drain
        claimed += await broker.claim_idle(w.keys.prompts, GROUP, "gen-b", cfg.broker.claim_idle_ms)
        await asyncio.sleep(0.05)
    await run
    assert claimed == []  # 1.5 s of drain, 5 x claim_idle_ms: kept alive throughout
    assert (await broker.client.xpending(w.keys.prompts, GROUP))["pending"] == 0
    assert await broker.get(w.keys.worker("generator", "gen-a")) is None  # deregistered at the end


class LosesCancellation(RedisBroker):
    """A broker call that swallows its cancellation, as one did inside a generator's first heartbeat
    SET right after its start (its stop then waited until the supervisor killed it)."""

    async def set(self, key, value, ttl_s=None) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass


class Idle(Worker):
    role = "generator"

    async def step(self) -> bool:
        await asyncio.sleep(0.05)
        return False


async def test_a_lost_cancellation_does_not_hang_the_stop(broker, config):
    w = Idle(config, LosesCancellation(broker.client), "gen-a")
    run = asyncio.create_task(w.run())
    await asyncio.sleep(0.3)  # the heartbeat task is inside its SET
    w.stop()
    await asyncio.wait_for(run, 10)  # before: waited on the heartbeat task forever
