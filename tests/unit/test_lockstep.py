"""env.lockstep's barrier (the synchronous turn loop of `streamrl bench env`): no episode starts its
next turn before every live episode has its observation; episodes that end release the others."""

import asyncio

import pytest

from streamrl.generate.env_channel import Lockstep

pytestmark = pytest.mark.anyio


async def test_barrier_waits_for_every_live_episode_and_leavers_release_it():
    ls = Lockstep()
    for e in ("a", "b", "c"):
        await ls.join(e)
    wa = asyncio.create_task(ls.wait("a"))
    wb = asyncio.create_task(ls.wait("b"))
    await asyncio.sleep(0.01)
    assert not wa.done() and not wb.done()  # c has not answered yet
    await ls.leave("c")  # c's episode ended instead
    await asyncio.wait_for(asyncio.gather(wa, wb), 1)
    # The next round starts empty: a alone waits for b again.
    wa = asyncio.create_task(ls.wait("a"))
    await asyncio.sleep(0.01)
    assert not wa.done()
    await asyncio.wait_for(ls.wait("b"), 1)
    await asyncio.wait_for(wa, 1)
