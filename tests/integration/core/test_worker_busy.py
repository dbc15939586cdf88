"""Every role reports how busy it was: `busy_fraction` in its heartbeat and `stopped` log line (the
share of loop time in steps that did work), and `streamrl report` shows one bar per such worker.

    pytest tests/integration/core/test_worker_busy.py
"""

from __future__ import annotations

import asyncio
import json

import pytest
from structlog.testing import capture_logs

from bench.common import pyplot
from streamrl.core.worker import Worker
from streamrl.report.figures import busy_figure
from streamrl.report.summary import summarize
from streamrl.train.metrics import MetricsWriter

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


class HalfBusy(Worker):
    """Four steps of work, then four idle polls of the same length, then done."""

    role = "reward"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.n = 0

    async def step(self) -> bool:
        self.n += 1
        self.done = self.n >= 8
        await asyncio.sleep(0.1)
        return self.n <= 4


class WaitsForInput(HalfBusy):
    role = "trainer"
    measures_busy = False


class OwnMeasure(HalfBusy):
    role = "generator"

    async def start(self) -> None:
        self.stats["busy_fraction"] = 0.9


async def _stopped(worker: Worker) -> dict:
    with capture_logs() as logs:
        await worker.run()
    return next(r for r in logs if r["event"] == "stopped")


async def test_busy_fraction_is_the_share_of_steps_that_did_work(config, broker):
    line = await _stopped(HalfBusy(config, broker, "reward-0"))
    assert line["busy_fraction"] == pytest.approx(0.5, abs=0.15)
    assert "busy_fraction" not in await _stopped(WaitsForInput(config, broker, "trainer-0"))
    assert (await _stopped(OwnMeasure(config, broker, "generator-0")))["busy_fraction"] == 0.9


async def test_report_shows_every_worker_that_logged_busy(config, broker, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    for worker in (
        HalfBusy(config, broker, "reward-0"),
        HalfBusy(config, broker, "reward-1"),
        OwnMeasure(config, broker, "generator-0"),
    ):
        (logs / f"{worker.worker_id}.jsonl").write_text(json.dumps(await _stopped(worker)) + "\n")
    w = MetricsWriter(tmp_path)
    for step in (1, 2):
        w.write({"step": step, "tokens": 10, "wait_s": 0.5, "train_s": 0.5})
    w.close()
    busy = summarize(tmp_path)["busy"]
    assert sorted(busy) == ["generator:generator-0", "reward:reward-0", "reward:reward-1", "trainer"]
    plt = pyplot()
    fig = busy_figure(plt, [{"step": 1, "train_s": 0.5, "wait_s": 0.5}], busy)
    assert [t.get_text() for t in fig.axes[1].get_yticklabels()] == ["generator-0", "reward-0", "reward-1", "trainer"]
    plt.close(fig)
