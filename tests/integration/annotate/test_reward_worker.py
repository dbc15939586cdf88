"""The reward worker against a real redis-server: scores, and failures that never stall it."""

import asyncio
import time

import pytest

from streamrl.core.messages import decode, encode
from tests.integration.annotate.one_rollout import rollout
from workers.reward import RewardWorker

pytestmark = pytest.mark.anyio


async def test_hangs_raises_and_nans_fail_only_their_rollout(config, broker):
    cfg = config.model_copy(deep=True)
    cfg.reward.fn = "tests.programs.reward_fns:misbehave"
    cfg.reward.timeout_s = 0.3
    worker = RewardWorker(cfg, broker, "reward-0")
    await worker.start()
    texts = ["ab", "hang", "raise", "nan"] + ["hang"] * 8 + ["abcd"]
    for i, t in enumerate(texts):
        await broker.add(worker.keys.rollouts, encode(rollout(i, t)))
    t0 = time.monotonic()
    while await worker.step():
        pass
    elapsed = time.monotonic() - t0
    # Nine hangs at 0.3 s each; a starved thread pool would time out everything after ~6 of them.
    assert elapsed < 9 * 0.3 + 3
    out = {a.rollout_id: a for a in (decode(e.data) for e in await worker.broker.read(worker.keys.annotations))}
    assert out["g0:0"].value == pytest.approx(0.2) and out["g0:0"].error == ""
    assert out["g12:0"].value == pytest.approx(0.4) and out["g12:0"].error == ""
    assert "timed out" in out["g1:0"].error and "raised ValueError: boom" in out["g2:0"].error
    assert "returned nan" in out["g3:0"].error
    assert all("timed out" in out[f"g{i}:0"].error for i in range(4, 12))
    dead = await broker.read(worker.keys.deadletter)
    assert len(dead) == 11
    info = {g["name"]: g for g in await broker.group_info(worker.keys.rollouts)}
    assert info["reward"]["pending"] == 0
    await asyncio.sleep(0)
