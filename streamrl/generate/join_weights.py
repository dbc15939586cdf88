"""A starting generator's first weights: the newest published version, read again while it cannot be
fetched (workers/generator.py calls `fetch_newest` before its first request).

A resumed trainer republishes the versions above its checkpoint (each folder replaced) and collects
older ones while a generator starts, so the files `weights:latest` names may be gone for a moment.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from streamrl.weights.store import WeightHandle, WeightLoader, WeightStoreError

JOIN_FETCH_WAIT_S = 30.0
"""How long the newest weights are read again while unreadable. One that stays unreadable (e.g.
`weights.backend: shm` on another host) ends the start with the loader's message."""
JOIN_RETRY_WAIT_S = 1.0
"""The wait between reads (a publish ends it at once)."""


async def fetch_newest(
    loader: WeightLoader, have: int, log: Any, on_failure: Callable[[], None]
) -> tuple[WeightHandle, str] | None:
    """(handle, local path) of the newest version above `have`, or None when there is none; after a
    failed fetch, `on_failure()` and a warning, then the newest is read again, for up to JOIN_FETCH_WAIT_S."""
    deadline = time.monotonic() + JOIN_FETCH_WAIT_S
    while True:
        newest = await loader.latest()
        if newest is None or newest.version <= have:
            return None
        try:
            return newest, await loader.fetch(newest)
        except WeightStoreError as exc:
            if time.monotonic() >= deadline:
                raise
            on_failure()
            log.warning("weights_fetch_failed", error=str(exc), retry_for_s=round(deadline - time.monotonic(), 1))
            await loader.wait_for_publish(JOIN_RETRY_WAIT_S)
