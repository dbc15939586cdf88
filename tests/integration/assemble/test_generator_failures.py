"""Groups a generator gives up (an episode failed) never reach the trainer's streams; the assembler counts
them in its failure streak from the broker (stats:groups_failed and the last reason), so a job whose env
hangs stops with that reason. Real redis-server.

    pytest tests/integration/assemble/test_generator_failures.py
"""

import asyncio

import pytest

from streamrl.core.accounting import fail_group, outcomes
from streamrl.core.errors import FatalError
from tests.integration.assemble.test_assembler import make

pytestmark = pytest.mark.anyio

HUNG = "episode g{}:0:ab turn 0: env step timed out after 0.2s in my_envs:Calc (env.step_timeout_s)"


async def test_generator_failed_groups_count_in_the_streak_and_stop_it_with_their_reason(config, broker):
    cfg, _, asm = make(config, broker, env__fn="my_envs:Calc", rollout__max_failing_s=0.3, rollout__groups_per_step=4)
    await fail_group(broker, asm.keys, "g-before", "a failure before this trainer started")
    await asm.start()
    await asm.generator_failures.read(every_s=0)  # the first read is the baseline: earlier ones are not a streak
    assert asm.streak.count == 0
    await fail_group(broker, asm.keys, "g1", HUNG.format(1))
    await fail_group(broker, asm.keys, "g1", HUNG.format(1))  # a retried close counts once
    await asm.generator_failures.read(every_s=0)
    assert asm.streak.count == 1 and asm.streak.first == HUNG.format(1)
    assert (await outcomes(broker, asm.keys))["g1"] == "failed"
    await asyncio.sleep(0.35)  # a step timeout later, the next round timed out too
    await fail_group(broker, asm.keys, "g2", HUNG.format(2))
    with pytest.raises(
        FatalError, match=r"^env step timed out after 0.2s in my_envs:Calc .*\(episode g1:0:ab, turn 0\)"
    ):
        await asm.generator_failures.read(every_s=0)
