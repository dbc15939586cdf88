"""broker.wait_replicas on Redis Cluster: the WAIT goes to the key's node; writes go on through a
master's SIGKILL and its replica's promotion (no acked write lost); with the killed master back as a
replica, WAIT is satisfied again; a killed node still in the slot map is named at a strict connect.

    pytest tests/integration/brokers/test_cluster_failover_wait.py
"""

from __future__ import annotations

import asyncio
import time

import pytest

from brokers.cluster import connect_cluster
from brokers.connect import connect
from brokers.local_cluster import LocalCluster
from brokers.replica_wait import ReplicaWait
from streamrl.core.errors import BrokerError

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]

KEY = "streamrl:cw:{p1}:rollouts"


def _flagged_failed(cluster: LocalCluster, seed: int, port: int) -> bool:
    with cluster.client(seed) as c:
        line = next(x for x in c.execute_command("CLUSTER", "NODES").decode().splitlines() if f":{port}@" in x)
    return "fail" in line.split()[2].split(",")


async def test_durable_writes_through_a_cluster_failover(tmp_path) -> None:
    with LocalCluster(tmp_path / "cluster") as cluster:
        # 2 s for a replica's ack: under the full suite's load a replica lagged 0.3-0.6 s (CI, 2026-12-06),
        # and a short first WAIT then failed the first check below with nothing wrong.
        wait = ReplicaWait(replicas=1, timeout_ms=2000)
        broker = await connect(cluster.url, retries=3, durable=wait)
        plain = await connect(cluster.url, retries=3)  # no WAIT: redis-py's own command path
        try:
            ids = [await broker.add(KEY, f"{i}".encode()) for i in range(20)]
            ids += await broker.add_many(KEY, [b"a", b"b"])  # a script (ADD_MANY), as the ledger's
            assert wait.short == 0, "the WAIT did not run where the write did (on the key's node)"

            victim = broker.client.get_node_from_key(KEY).port
            cluster.kill(victim)
            t0 = time.monotonic()
            ids += [await plain.add(KEY, b"plain")]  # retried (FailoverCluster) until the replica is promoted
            failover_s = time.monotonic() - t0
            ids += [await broker.add(KEY, b"after")]
            assert broker.client.get_node_from_key(KEY).port != victim
            assert wait.unreplicated >= 1, "the promoted master has no replica yet: counted, not waited on"
            # the local cluster's failover (was test_local_cluster's own cluster): the replica took over
            cluster.wait_ok(60)
            assert victim not in cluster.masters() and len(cluster.masters()) == 3

            cluster.restart(victim)  # it rejoins as the new master's replica
            cluster.wait_ok(60)
            short = wait.short
            ids += [await broker.add(KEY, f"{i}".encode()) for i in range(5)]
            assert wait.short == short, "with a replica back in sync, WAIT is satisfied at once"
            entries = await broker.read(KEY, "0", count=1000)
            assert {e.id for e in entries} >= set(ids), "an acked write is missing after the failover"
            assert failover_s < 30
        finally:
            await broker.close(timeout_s=2)
            await plain.close(timeout_s=2)
        await asyncio.sleep(0)


async def test_a_wait_sent_to_a_master_turned_replica_is_retried_on_the_new_map(tmp_path) -> None:
    """The e2e failure this guards: a killed master came back as its successor's replica while the
    trainer's slot map still named it; the write followed MOVED, but the WAIT pinned to the old node got
    "WAIT cannot be used with replica instances" and the trainer died. A manual failover (CLUSTER
    FAILOVER on the replica) makes the same stale map without a kill."""
    with LocalCluster(tmp_path / "cluster") as cluster:
        wait = ReplicaWait(replicas=1, timeout_ms=500)
        broker = await connect(cluster.url, retries=3, durable=wait)
        try:
            first = await broker.add(KEY, b"before")
            old = broker.client.get_node_from_key(KEY).port
            with cluster.client(old) as c:
                replica = next(
                    int(v["port"])
                    for k, v in c.info("replication").items()
                    if k.startswith("slave") and k[5:].isdigit()
                )
            with cluster.client(replica) as c:
                c.execute_command("CLUSTER", "FAILOVER")
            deadline = time.monotonic() + 30
            while replica not in cluster.masters() or old in cluster.masters():
                assert time.monotonic() < deadline, "the manual failover did not complete"
                await asyncio.sleep(0.1)
            cluster.wait_ok(60)
            assert broker.client.get_node_from_key(KEY).port == old, "the client saw the failover already"

            after = await broker.add(KEY, b"after")  # the WAIT would go to `old`, a replica now
            assert broker.client.get_node_from_key(KEY).port == replica
            entries = await broker.read(KEY, "0", count=10)
            assert [e.id for e in entries] == [first, after]
            assert wait.unreplicated == 0, "the old master (a replica now) was taken for a master alone"
        finally:
            await broker.close(timeout_s=2)
        # A killed node still in the cluster's map (a replica, flagged failed, so no longer among the slots'
        # nodes) is named at a strict connect from the map (was test_cluster_broker's own cluster).
        cluster.kill(old)
        seed = cluster.masters()[0]
        deadline = time.monotonic() + 60
        while not _flagged_failed(cluster, seed, old):
            assert time.monotonic() < deadline, "the cluster did not flag the killed replica as failed"
            await asyncio.sleep(0.2)
        url = f"redis+cluster://:{cluster.password}@127.0.0.1:{seed}"
        with pytest.raises(BrokerError, match=rf"nodes down: 127.0.0.1:{old} \(a node of the cluster: slave"):
            await connect_cluster(url, retries=0, strict=True)
