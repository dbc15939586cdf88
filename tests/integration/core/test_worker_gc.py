"""A worker's start-up heap is frozen out of the cyclic GC before its loop (streamrl/core/worker.py,
freeze_startup_heap): full collections in the loop then walk only what the loop allocated.

    pytest tests/integration/core/test_worker_gc.py
"""

from __future__ import annotations

import gc

import pytest

from streamrl.core.worker import Worker

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


class Probe(Worker):
    role = "reward"

    async def start(self) -> None:
        self.loaded = {"model": [1, 2, 3]}  # what a role loads at start-up (a model, tables)

    async def step(self) -> bool:
        made = {"message": [4]}
        ids = {id(o) for o in gc.get_objects()}  # the GC's generations: frozen objects are not in them
        self.seen = {"loaded": id(self.loaded) in ids, "made": id(made) in ids}
        self.done = True
        return True


async def test_startup_objects_are_frozen_and_loop_objects_are_not(config, broker):
    worker = Probe(config, broker, "reward-0")
    try:
        await worker.run()
    finally:
        gc.unfreeze()  # the test process goes on as before
    assert worker.seen == {"loaded": False, "made": True}
