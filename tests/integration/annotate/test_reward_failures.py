"""Failing reward functions against a real redis-server: the real reward worker scores, the real
assembler joins. A reward that always fails stops the job after rollout.max_consecutive_failed_groups
(FatalError), the dead-letter watch counts the causes, and reward.on_error decides a failure's fate.
"""

import asyncio
import zlib

import numpy as np
import pytest

from streamrl.assemble.assembler import Assembler
from streamrl.core.errors import FatalError
from streamrl.core.messages import Rollout, encode, new_rollout_id
from streamrl.core.worker import Worker
from streamrl.launch.failures import DeadLetterWatch
from workers.reward import RewardWorker

pytestmark = pytest.mark.anyio
GROUP_SIZE = 4


class Owner(Worker):
    role = "trainer"


def rollout(gid: str, sample: int, text: str) -> Rollout:
    return Rollout(
        rollout_id=new_rollout_id(gid, sample),
        group_id=gid,
        sample=sample,
        group_size=GROUP_SIZE,
        prompt_ids=np.array([4, 5]),
        completion_ids=np.array([6, 7, 8]),
        logprobs=np.array([-1.0] * 3),
        version=0,
        prompt_text="ab",
        text=text,
        meta={"length": 4, "chars": "ab"},
    )


async def score_groups(cfg, broker, groups: int, text=lambda g, s: f"ab{g}-{s}") -> Assembler:
    """Publish `groups` groups, score them all with the real reward worker; the assembler, started."""
    owner = Owner(cfg, broker, "trainer-0")
    asm = Assembler(cfg, broker, owner.log, owner.count)
    await asm.start()
    reward = RewardWorker(cfg, broker, "reward-0")
    await reward.start()
    for g in range(groups):
        for s in range(GROUP_SIZE):
            await broker.add(owner.keys.rollouts, encode(rollout(f"g{g}", s, text(g, s))))
    while await reward.step():
        pass
    await reward.close()
    return asm


def configure(config, fn: str, **changes):
    cfg = config.model_copy(deep=True)
    cfg.reward.fn = f"tests.programs.reward_fns:{fn}"
    cfg.loss.kl_beta = 0.0
    for dotted, value in changes.items():
        section, field = dotted.split("__")
        setattr(getattr(cfg, section), field, value)
    return cfg


@pytest.mark.parametrize(
    "fn, error",
    [
        ("always_raise", "reward function raised ValueError: grader unavailable"),
        ("always_nan", "reward function returned nan"),
    ],
)
async def test_an_always_failing_reward_stops_after_the_bound(config, broker, fn, error):
    cfg = configure(config, fn, rollout__max_consecutive_failed_groups=5, rollout__groups_per_step=2)
    asm = await score_groups(cfg, broker, groups=8)
    with pytest.raises(FatalError) as info:
        await asyncio.wait_for(asm.next_batch(0), 20)
    msg = str(info.value)
    assert "5 groups in a row failed" in msg and error in msg and "reward.on_error=score" in msg, msg
    assert asm.counters["failed"] == 5
    watch = DeadLetterWatch(config.broker.url, cfg.run.name)
    line = watch.poll(force=True)
    watch.close()
    assert line is not None and f"{error.split(': ')[0]}: {8 * GROUP_SIZE}" in line and f"first: {error}" in line, line


async def test_the_streak_resets_on_a_group_that_completes(config, broker):
    # Groups 0-2 fail (every text of theirs starts with "raise"), g3 completes, g4-g6 fail: never 4 in a row.
    texts = lambda g, s: "raise" if g != 3 else "ab"  # noqa: E731
    cfg = configure(config, "misbehave", rollout__max_consecutive_failed_groups=4, rollout__groups_per_step=1)
    asm = await score_groups(cfg, broker, groups=7, text=texts)
    batch = await asyncio.wait_for(asm.next_batch(0), 20)
    await asyncio.wait_for(asm.poll(), 5)  # files what is left: the last three failed groups
    assert batch.group_ids == ["g3"] and asm.counters["failed"] == 6 and asm.streak.count == 3


def flaky(g: int, s: int) -> str:
    return f"ab{g}-{s}"


def fails(text: str) -> bool:
    """Whether tests.programs.reward_fns:fail_one_in_five raises on this completion."""
    return zlib.crc32(text.encode()) % 5 == 0


async def test_on_error_drop_discards_groups_and_score_trains_them(config, broker, run_name):
    groups = 10
    bad = {g for g in range(groups) if any(fails(flaky(g, s)) for s in range(GROUP_SIZE))}
    assert 0 < len(bad) < groups, "the fixture texts must fail on some rollouts only"
    cfg = configure(config, "fail_one_in_five", rollout__groups_per_step=groups - len(bad))
    asm = await score_groups(cfg, broker, groups)
    batch = await asyncio.wait_for(asm.next_batch(0), 20)
    assert asm.counters["failed"] == len(bad) and not set(batch.group_ids) & {f"g{g}" for g in bad}

    config.run.name = run_name + "-score"  # a fresh namespace on the same server
    cfg = configure(
        config, "fail_one_in_five", rollout__groups_per_step=groups, reward__on_error="score", reward__error_value=-1.0
    )
    asm = await score_groups(cfg, broker, groups)
    batch = await asyncio.wait_for(asm.next_batch(0), 20)
    assert asm.counters["failed"] == 0 and len(batch.group_ids) == groups
    failed = np.asarray([fails(r.text) for r in batch.rollouts])
    assert failed.any() and np.all(batch.rewards[failed] == -1.0) and np.all(batch.rewards[~failed] >= 0)


async def test_on_error_score_still_stops_when_every_rollout_fails(config, broker):
    cfg = configure(config, "always_raise", rollout__max_consecutive_failed_groups=3, reward__on_error="score")
    asm = await score_groups(cfg, broker, groups=4)
    with pytest.raises(FatalError, match="3 groups in a row failed"):
        await asyncio.wait_for(asm.next_batch(0), 20)


async def test_a_failure_streak_in_the_background_intake_reaches_next_batch(config, broker):
    """The intake task's FatalError (here: every group failed) is raised where the batch is asked for,
    as it is when next_batch polls itself; the intake then ends."""
    cfg = configure(config, "always_raise", rollout__max_consecutive_failed_groups=5, rollout__groups_per_step=2)
    asm = await score_groups(cfg, broker, groups=8)
    asm.start_intake()
    try:
        with pytest.raises(FatalError, match="5 groups in a row failed"):
            await asyncio.wait_for(asm.next_batch(0), 20)
    finally:
        await asm.stop_intake()
    assert asm.counters["failed"] == 5
