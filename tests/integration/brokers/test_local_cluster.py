"""The local cluster launcher (brokers/local_cluster.py): 3 masters + 3 replicas of the system redis-server,
every slot served, each replica in sync (one master killed, its replica promoted:
test_cluster_failover_wait.py).

    pytest tests/integration/brokers/test_local_cluster.py
"""

from __future__ import annotations

import pytest

from brokers.local_cluster import LocalCluster
from streamrl.core.errors import BrokerError


def test_cluster_serves_every_slot_with_a_replica_per_master(redis_cluster):
    assert len(redis_cluster.masters()) == 3
    with redis_cluster.client(redis_cluster.nodes[0].port) as c:
        info = c.cluster("info")
        assert info["cluster_state"] == "ok" and info["cluster_known_nodes"] == "6"
        assert c.cluster("countkeysinslot", 0) == 0  # a node answers cluster commands
    assert redis_cluster.url.startswith("redis+cluster://:")
    assert redis_cluster.url.count(",") == 5


# One master killed, its replica promoted: test_cluster_failover_wait.py's first test (on its own cluster).


def test_fewer_than_three_masters_names_the_fix(tmp_path):
    with pytest.raises(BrokerError, match="at least 3 masters"):
        LocalCluster(tmp_path, masters=2)
