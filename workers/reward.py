"""Reward role: score each rollout with the configured function and publish a `reward` annotation.

    streamrl worker reward --config configs/tiny-cpu.yaml --broker redis://... --run tiny

Reads `rollouts` with the consumer group "reward" (workers of this role share the load), writes
Annotation(key="reward") to `annotations`, then acks. A function that raises, hangs past
reward.timeout_s, or returns a non-finite value yields an annotation with `error` set (the
assembler drops that group and the feeder admits a replacement) and a dead-letter record.
"""

from __future__ import annotations

import asyncio
import math

from streamrl.messages import Annotation, Rollout, encode
from streamrl.rewards import resolve_reward
from streamrl.worker import Worker

GROUP = "reward"


class RewardWorker(Worker):
    role = "reward"

    async def start(self) -> None:
        self.fn = resolve_reward(self.cfg.reward.fn)
        await self.broker.ensure_group(self.keys.rollouts, GROUP)

    async def _score(self, r: Rollout) -> tuple[float, str]:
        try:
            value = await asyncio.wait_for(
                asyncio.to_thread(self.fn, r.prompt_text, r.text, r.meta), self.cfg.reward.timeout_s)
            value = float(value)
        except asyncio.TimeoutError:
            return 0.0, f"reward function timed out after {self.cfg.reward.timeout_s}s"
        except Exception as exc:  # user code: any exception is that rollout's failure, not ours
            return 0.0, f"reward function raised {type(exc).__name__}: {exc}"
        if not math.isfinite(value):
            return 0.0, f"reward function returned {value}"
        return value, ""

    async def step(self) -> bool:
        items = await self.read(self.keys.rollouts, GROUP, count=64, expect=Rollout)
        if not items:
            return False
        scores = await asyncio.gather(*(self._score(msg) for _, msg in items))
        out = []
        for (entry, msg), (value, error) in zip(items, scores):
            if error:
                await self.dead_letter(self.keys.rollouts, entry, error)
            out.append(encode(Annotation(rollout_id=msg.rollout_id, key="reward", value=value,
                                         producer=self.worker_id, error=error)))
        await self.broker.add_many(self.keys.annotations, out)
        await self.broker.ack(self.keys.rollouts, GROUP, [e.id for e, _ in items])
        self.count("scored", len(items))
        return True
