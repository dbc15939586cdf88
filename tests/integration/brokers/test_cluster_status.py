"""`streamrl status` on a partitioned job (rollout.partitions=3) whose `streamrl up` uses an external broker
(a local Redis Cluster): `--run-dir` finds the broker in the run's config.yaml, and the view shows each
partitioned stream as the sum over its partitions (length, every group's pending and lag) with a row per
partition, so an external producer's lag is visible.

    pytest tests/integration/brokers/test_cluster_status.py
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from brokers.connect import connect
from streamrl.core.broker import Keys
from streamrl.core.messages import encode
from tests.integration.annotate.test_producers import rollout

pytestmark = pytest.mark.anyio
RUN = "status-p3"


def status(*args: str) -> str:
    res = subprocess.run(
        [sys.executable, "-m", "streamrl.cli", "status", "--once", *args], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def row(out: str, first: str) -> list[str]:
    """The cells of the streams table's row whose first cell starts with `first`."""
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("│┃").split("│")]
        if cells and cells[0].startswith(first):
            return cells
    raise AssertionError(f"no row {first!r} in:\n{out}")


async def test_status_shows_every_partition_and_finds_an_external_broker_in_the_run_dir(redis_cluster, tmp_path):
    keys = Keys(RUN, 3, cluster=True)
    broker = await connect(redis_cluster.url, retries=3)
    try:
        for stream in keys.rollout_streams:
            await broker.ensure_group(stream, "judge")
            await broker.add_many(stream, [encode(rollout(j, 4)) for j in range(5)])
        await broker.read_group(keys.rollout_streams[0], "judge", "judge-0", count=2)  # 2 pending there
    finally:
        await broker.close()
    run_dir = tmp_path / "run"  # a live `up` on an external broker: config.yaml, no broker/url, no summary
    run_dir.mkdir()
    cfg = {"run": {"name": RUN}, "broker": {"url": redis_cluster.url}, "rollout": {"partitions": 3}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))

    for out in (status("--run-dir", str(run_dir)), status("--broker", redis_cluster.url, "--run", RUN)):
        total = row(out, "rollouts (3 partitions)")
        assert total[1:] == ["15", "judge", "1", "2", "13"], total  # length, group, consumers, pending, lag
        first = row(out, f"[0] {keys.rollout_streams[0].split('{')[1].split('}')[0]}")
        assert first[1:] == ["5", "judge", "1", "2", "3"], first
        assert row(out, "[2]")[1:] == ["5", "judge", "0", "0", "5"]
        assert row(out, "annotations (3 partitions)")[1] == "0"
