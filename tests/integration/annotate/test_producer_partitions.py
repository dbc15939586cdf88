"""A producer started with another --partitions than the job's rollout.partitions says so at start (it
would read streams nobody writes), naming the flag; one started with the job's says nothing.

    pytest tests/integration/annotate/test_producer_partitions.py
"""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from streamrl.annotate.sdk import ProducerWorker, spec_of
from streamrl.config.schema import BrokerConfig
from streamrl.core.broker import Keys

pytestmark = pytest.mark.anyio


def ones(broker, run: str, partitions: int, **broker_cfg) -> ProducerWorker:
    """A producer `judge-0` of key `judge` that scores every rollout 1.0, for a job of `partitions`."""
    spec = spec_of(lambda rs: [], key="judge")
    return ProducerWorker(
        lambda rs: [1.0] * len(rs), spec, broker, run, "judge-0", BrokerConfig(**broker_cfg), partitions
    )


async def started(broker, run: str, partitions: int) -> list[dict]:
    worker = ones(broker, run, partitions)
    with capture_logs() as logs:
        await worker.start()
    return [e for e in logs if e["event"].startswith("rollouts_not")]


async def test_a_producer_with_the_wrong_partitions_warns(broker, run_name):
    for stream in Keys(run_name, 3).rollout_streams:  # the job (rollout.partitions=3) has started
        await broker.ensure_group(stream, "trainer")
    wrong = await started(broker, run_name, 1)
    assert len(wrong) == 1 and wrong[0]["event"] == "rollouts_not_found", wrong
    assert "--partitions" in wrong[0]["fix"] and wrong[0]["missing"] == [Keys(run_name).rollouts]
    assert await started(broker, run_name, 3) == []
