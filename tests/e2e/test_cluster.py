"""`streamrl up` on a local Redis Cluster (3 masters + 3 replicas, brokers/local_cluster.py) with
`rollout.partitions=3`: the job trains, every partition carries traffic, and the accounting is exact.

    pytest tests/e2e/test_cluster.py
"""

from __future__ import annotations

import json

import pytest

from streamrl.core.broker import Keys
from streamrl.core.broker_url import sync_client
from tests.e2e.test_up import metrics, up

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_partitioned_job_on_a_cluster_trains_with_exact_accounting(tmp_path, redis_cluster):
    run_dir = tmp_path / "cluster"
    res = up(
        run_dir,
        f"broker.url={redis_cluster.url}",
        "rollout.partitions=3",
        "run.name=clustered",
        "trainer.steps=6",
        "rollout.max_staleness=2",
        "run.export=false",
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert [r["step"] for r in metrics(run_dir)] == list(range(1, 7))
    summary = json.loads((run_dir / "summary.json").read_text())
    parts = ("trained", "dropped_stale", "filtered", "failed", "requeued", "in_flight", "lost")
    assert summary["admitted"] == sum(summary[k] for k in parts), summary
    assert summary["invariant_holds"] and summary["lost"] == 0 and summary["double_trained"] == 0, summary
    assert summary["trained"] == 6 * 8 and summary["dead_lettered"] == 0, summary  # tiny-cpu: 8 groups a step
    keys = Keys("clustered", 3, cluster=True)
    with sync_client(redis_cluster.url) as r:
        # Every partition was written and read by the trainer, each on its own master.
        read = {s: {g["name"]: g["entries-read"] for g in r.xinfo_groups(s)}[b"trainer"] for s in keys.rollout_streams}
        assert all(n and n > 0 for n in read.values()), read
        owners = {r.keyslot(s): r.nodes_manager.get_node_from_slot(r.keyslot(s)).name for s in keys.rollout_streams}
        assert len(set(owners.values())) == 3, owners
