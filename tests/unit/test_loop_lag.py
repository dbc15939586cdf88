"""streamrl.generate.loop_lag: a blocked event loop shows up as timer lag, per window and in the summary."""

from __future__ import annotations

import asyncio
import time

from streamrl.generate.loop_lag import LoopLag


def test_a_blocked_loop_is_measured_and_a_free_one_is_not():
    async def main():
        lag = LoopLag(period_s=0.005)
        task = asyncio.create_task(lag.run())
        await asyncio.sleep(0.1)  # idle: timers fire on time
        free = lag.max_since(0)
        mark = time.time()
        time.sleep(0.15)  # a callback that holds the loop
        await asyncio.sleep(0.05)
        task.cancel()
        return free, lag.max_since(mark), lag.summary()

    free, blocked, summary = asyncio.run(main())
    assert free < 0.05
    assert 0.12 < blocked < 1.0  # the timer due during the block fired ~0.15 s late
    assert summary["loop_lag_max_s"] >= blocked and 0 <= summary["loop_lag_p99_s"] <= summary["loop_lag_max_s"]


def test_no_samples_no_summary():
    assert LoopLag().summary() == {} and LoopLag().max_since(0) == 0.0
