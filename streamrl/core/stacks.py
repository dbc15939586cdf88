"""What the pending asyncio tasks are waiting on: logged on a slow stop (`stop_slow`, `forced_exit`,
`background_tasks_left`) by streamrl/launch/runtime.py and streamrl/core/worker.py.

    log.warning("stop_slow", tasks=task_stacks())
"""

from __future__ import annotations

import asyncio
from pathlib import Path


def task_stacks(depth: int = 8) -> list[str]:
    """Each pending asyncio task and the innermost calls it is suspended in (a slow stop's culprit):
    the chain of awaited coroutines, which Task.get_stack does not follow."""
    out = []
    for task in asyncio.all_tasks():
        frames, coro = [], task.get_coro()
        while coro is not None:
            frame = (
                getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None) or getattr(coro, "ag_frame", None)
            )
            if frame is not None:
                frames.append(f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}:{frame.f_code.co_qualname}")
            coro = (
                getattr(coro, "cr_await", None)
                or getattr(coro, "gi_yieldfrom", None)
                or getattr(coro, "ag_await", None)
            )
        out.append(f"{task.get_name()}: {' -> '.join(frames[-depth:]) or 'not started'}")
    return out
