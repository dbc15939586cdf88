"""Reward role: score each rollout with the configured function and publish a `reward` annotation.

    streamrl worker reward --config configs/tiny-cpu.yaml --broker redis://... --run tiny

Reads `rollouts` with the consumer group "reward" (workers of this role share the load), writes
Annotation(key="reward") to `annotations`, then acks (the annotator loop, streamrl/annotate/annotator.py).
A function that raises, hangs past reward.timeout_s, or returns a non-finite value yields an
annotation with `error` set (the assembler drops that group and the feeder admits a replacement)
and a dead-letter record.
"""

from __future__ import annotations

from streamrl.annotate.annotator import Annotator
from streamrl.annotate.reward_calls import score_batch
from streamrl.annotate.rewards import make_reward
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

    async def annotate(self, rollouts: list[Rollout]) -> list[tuple]:
        """Score a batch on one call thread; a call that hangs past reward.timeout_s fails that
        rollout only (streamrl/annotate/reward_calls.py, the same scoring `streamrl eval` does)."""
        items = [(r.prompt_text, r.text, r.meta) for r in rollouts]
        return await score_batch(
            self.fn, items, self.calls, self.cfg.reward.timeout_s, on_timeout=lambda: self.count("reward_timeouts")
        )
