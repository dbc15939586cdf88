"""`streamrl bench broker --cluster --partitions 1,3 --wait-replicas 1` on tiny settings: one standalone
server and the local cluster once per P, per-node CPU of every node, the sizing projection.

    pytest tests/integration/bench/test_bench_broker_cluster.py
"""

from __future__ import annotations

import pytest

from tests.integration.bench.test_bench_broker import _bench

pytestmark = pytest.mark.timeout(180)


def test_cluster_bench_reports_every_node_and_a_projection(tmp_path):
    result, _, stdout = _bench(tmp_path, "--cluster", "--partitions", "1,3", "--wait-replicas", "1", rollouts=96)
    runs = result["runs"]
    assert [r["run"] for r in runs] == [
        "standalone, 1 server",
        "cluster 3+3, partitions=1 +WAIT",
        "cluster 3+3, partitions=3 +WAIT",
    ]
    assert all(r["rollouts"] == 96 for r in runs), [r["rollouts"] for r in runs]
    for r in runs[1:]:
        roles = sorted(n["role"] for n in r["nodes"].values())
        assert roles == ["master"] * 3 + ["slave"] * 3, r["nodes"]
    # partitions=3 puts stream traffic on every master; partitions=1 keeps the run on one slot
    busy = [n["cpu_s"] for n in runs[2]["nodes"].values() if n["role"] == "master"]
    assert all(c > 0 for c in busy), runs[2]["nodes"]
    assert len(result["projection"]) == 2 and all(p["masters"] >= 3 for p in result["projection"].values())
    assert "sizing (assumptions" in stdout
