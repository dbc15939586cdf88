"""Combined rewards through the real reward worker and assembler on a real redis-server: the `reward`
annotation is the weighted sum and carries each component, which the batch reports per component
(metrics.jsonl's reward_components["reward/<name>"]).

    pytest tests/integration/annotate/test_reward_components.py -q
"""

import asyncio

import numpy as np
import pytest

from streamrl.config.schema import RewardComponent
from streamrl.core.messages import decode, encode, sample_key
from tests.integration.assemble.test_assembler import make, rollout
from workers.reward import RewardWorker

pytestmark = pytest.mark.anyio

COMPLETIONS = ["<think>6*7</think> \\boxed{42}", "\\boxed{42}", "<think>hmm</think> 41", "no idea"]


async def test_components_reach_the_batch(config, broker):
    parts = [RewardComponent(fn="math", weight=1.0), RewardComponent(fn="think_format", weight=0.5)]
    cfg, owner, asm = make(config, broker, rollout__groups_per_step=1, loss__kl_beta=0.0, reward__components=parts)
    worker = RewardWorker(cfg, broker, "reward-0")
    await worker.start()
    await asm.start()
    for i, text in enumerate(COMPLETIONS):
        r = rollout("g0", i, n=len(COMPLETIONS))
        r.text, r.meta = text, {"answer": "42"}
        await broker.add(owner.keys.rollouts, encode(r))
    while await worker.step():
        pass
    anns = {sample_key(a.rollout_id): a for a in (decode(e.data) for e in await broker.read(owner.keys.annotations))}
    assert anns["g0:0"].value == pytest.approx(1.5) and anns["g0:0"].parts == {"math": 1.0, "think_format": 1.0}
    assert anns["g0:2"].parts == {"math": 0.0, "think_format": 1.0}
    batch = await asyncio.wait_for(asm.next_batch(0), 10)
    np.testing.assert_allclose(batch.rewards, [1.5, 1.0, 0.5, 0.0])
    np.testing.assert_allclose(batch.reward_components["reward"], [1.5, 1.0, 0.5, 0.0])
    np.testing.assert_allclose(batch.reward_components["reward/math"], [1, 1, 0, 0])
    np.testing.assert_allclose(batch.reward_components["reward/think_format"], [1, 0, 1, 0])
