"""Reward role: score each rollout with the configured function and publish a `reward` annotation.

    streamrl worker reward --config configs/tiny-cpu.yaml --broker redis://... --run tiny

Reads `rollouts` with the consumer group "reward" (workers of this role share the load), writes
Annotation(key="reward") to `annotations`, then acks (the annotator loop, streamrl/annotate/annotator.py).
A function that raises, hangs past reward.timeout_s, or returns a non-finite value yields an
annotation with `error` set (the assembler drops that group and the feeder admits a replacement)
and a dead-letter record.
"""

from __future__ import annotations

import math

from streamrl.annotate.annotator import Annotator
from streamrl.annotate.rewards import make_reward
from streamrl.core.calls import CallTimeout
from streamrl.core.messages import Rollout

GROUP = "reward"


class RewardWorker(Annotator):
    role = "reward"
    key = "reward"
    group = GROUP

    async def start(self) -> None:
        self.fn = make_reward(self.cfg.reward)
        for stream in self.keys.rollout_streams:
            await self.broker.ensure_group(stream, GROUP)

    def _score(self, r: Rollout):
        out = self.fn(r.prompt_text, r.text, r.meta)
        return float(out), getattr(out, "parts", {})  # parts: reward.components' scores

    async def annotate(self, rollouts: list[Rollout]) -> list[tuple]:
        """Score a batch on one call thread, waking the event loop once per batch; a call that hangs
        past reward.timeout_s fails that rollout only (streamrl/core/calls.py, Calls.map)."""
        timeout = self.cfg.reward.timeout_s
        out = []
        for ok, got in await self.calls.map(self._score, rollouts, timeout):
            if not ok and isinstance(got, CallTimeout):
                self.count("reward_timeouts")
                out.append((0.0, f"reward function timed out after {timeout}s"))
            elif not ok:  # user code: any exception is that rollout's failure, not ours
                out.append((0.0, f"reward function raised {type(got).__name__}: {got}"))
            elif math.isfinite(got[0]):
                out.append((got[0], "", got[1]))
            else:
                out.append((0.0, f"reward function returned {got[0]}"))
        return out
