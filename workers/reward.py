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
import threading

from streamrl.messages import Rollout
from streamrl.rewards import resolve_reward
from streamrl.worker import Worker

GROUP = "reward"


class RewardWorker(Worker):
    role = "reward"

    async def start(self) -> None:
        self.fn = resolve_reward(self.cfg.reward.fn)
        await self.broker.ensure_group(self.keys.rollouts, GROUP)

    def _score_from(self, rollouts: list[Rollout], first: int, report, cancelled: threading.Event) -> None:
        """Thread body: score rollouts[first:] in order, reporting ("start"|"done", index, result)."""
        for i in range(first, len(rollouts)):
            if cancelled.is_set():
                return
            r = rollouts[i]
            report(("start", i, None))
            try:
                value = float(self.fn(r.prompt_text, r.text, r.meta))
                result = (value, "") if math.isfinite(value) else (0.0, f"reward function returned {value}")
            except Exception as exc:  # user code: any exception is that rollout's failure, not ours
                result = (0.0, f"reward function raised {type(exc).__name__}: {exc}")
            report(("done", i, result))

    async def _score_all(self, rollouts: list[Rollout]) -> list[tuple[float, str]]:
        """Score a batch in one thread hop. A call that hangs past reward.timeout_s fails that
        rollout only: its thread is abandoned (a daemon; told to stop at the next item) and a
        fresh thread carries on after it, so hung calls never starve later ones."""
        loop = asyncio.get_running_loop()
        timeout = self.cfg.reward.timeout_s
        results: list[tuple[float, str] | None] = [None] * len(rollouts)
        nxt = 0
        while nxt < len(rollouts):
            queue: asyncio.Queue = asyncio.Queue()
            cancelled = threading.Event()
            threading.Thread(target=self._score_from, daemon=True, name="reward-fn",
                             args=(rollouts, nxt, _reporter(loop, queue, cancelled), cancelled)).start()
            while nxt < len(rollouts):
                try:
                    kind, i, result = await asyncio.wait_for(queue.get(), timeout)
                except asyncio.TimeoutError:
                    cancelled.set()
                    results[nxt] = (0.0, f"reward function timed out after {timeout}s")
                    self.count("reward_timeouts")
                    nxt += 1
                    break
                if kind == "done":
                    results[i] = result
                    nxt = i + 1
        return results  # type: ignore[return-value]

    async def step(self) -> bool:
        items = await self.read(self.keys.rollouts, GROUP, count=64, expect=Rollout)
        if not items:
            return False
        scores = await self._score_all([msg for _, msg in items])
        await self.publish_annotations(self.keys.rollouts, GROUP, "reward", items, scores)
        return True


def _reporter(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, cancelled: threading.Event):
    """The scoring thread's way back to the loop; an abandoned (hung) call that returns after the
    worker stopped finds the loop closed and is dropped quietly."""
    def report(message) -> None:
        if cancelled.is_set():
            return
        try:
            loop.call_soon_threadsafe(queue.put_nowait, message)
        except RuntimeError:  # event loop is closed
            pass
    return report
