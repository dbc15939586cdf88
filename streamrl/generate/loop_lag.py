"""How late a role's asyncio loop runs a short timer: the generator's loop serves every request's
token stream, publishes each rollout and runs the weight watcher, so a busy loop delays a weight
switch before any vLLM call starts (docs/performance.md, "Weight sync")."""

from __future__ import annotations

import asyncio
import time
from collections import deque


class LoopLag:
    def __init__(self, period_s: float = 0.02, keep: int = 3000):
        self.period_s = period_s
        self.samples: deque[tuple[float, float]] = deque(maxlen=keep)
        """(wall-clock time the timer fired, seconds late), the newest `keep` of them."""
        self.last_tick: float | None = None
        """time.monotonic() when the timer last fired (None while it is not running): read by another
        thread (streamrl/generate/loop_profile.py) to tell whether the loop is held right now."""

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self.last_tick = time.monotonic()
        try:
            while True:
                t = loop.time()
                await asyncio.sleep(self.period_s)
                self.last_tick = time.monotonic()
                self.samples.append((time.time(), max(loop.time() - t - self.period_s, 0.0)))
        finally:  # a stopped timer says nothing about the loop: no sample counts as blocked
            self.last_tick = None

    def max_since(self, wall: float) -> float:
        """The largest lag of a timer that fired at or after `wall` (time.time())."""
        return round(max((lag for t, lag in self.samples if t >= wall), default=0.0), 4)

    def summary(self) -> dict:
        lags = sorted(lag for _, lag in self.samples)
        if not lags:
            return {}
        return {"loop_lag_p99_s": round(lags[int(0.99 * (len(lags) - 1))], 4), "loop_lag_max_s": round(lags[-1], 4)}
