"""`streamrl.launch.runtime.task_stacks`: what a slow stop is waiting on, logged on `stop_slow` / `forced_exit`."""

import asyncio

from streamrl.launch.runtime import task_stacks


async def _wait_on(event: asyncio.Event) -> None:
    await event.wait()


def test_task_stacks_name_each_pending_task_and_where_it_waits():
    async def main() -> list[str]:
        event = asyncio.Event()
        task = asyncio.create_task(_wait_on(event), name="stuck-group")
        await asyncio.sleep(0)
        try:
            return task_stacks()
        finally:
            event.set()
            await task

    stacks = asyncio.run(main())
    stuck = [s for s in stacks if s.startswith("stuck-group: ")]
    assert len(stuck) == 1 and "test_task_stacks.py" in stuck[0] and "_wait_on" in stuck[0], stacks
