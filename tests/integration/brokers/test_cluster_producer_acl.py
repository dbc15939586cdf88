"""`streamrl producer add` on a Redis Cluster (brokers/local_cluster.py, 3 masters + 3 replicas): the user
exists on every node, masters and replicas, under the partitioned cluster key names, with what a cluster
client needs (CLUSTER SLOTS/INFO, COMMAND), survives a node restart and a failover (saved by CONFIG REWRITE
into each node's config file), and is denied everything outside its grant. A user without the cluster
grant is told which NOPERM and what to add. docs/protocol.md, "Access control".

    pytest tests/integration/brokers/test_cluster_producer_acl.py
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest
from redis.exceptions import NoPermissionError

from brokers.connect import connect
from brokers.local_cluster import LocalCluster
from streamrl.core.broker import Keys
from streamrl.core.errors import BrokerError
from streamrl.core.messages import Annotation, decode, encode
from tests.integration.annotate.test_producer_partitions import ones
from tests.integration.annotate.test_producers import rollout

pytestmark = pytest.mark.anyio
RUN = "acl"
P = 3


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamrl.cli", *args], capture_output=True, text=True, timeout=120)


def users_on(cluster: LocalCluster, port: int) -> set[str]:
    with cluster.client(port) as c:
        return {u.decode() for u in c.execute_command("ACL", "USERS")}


async def annotations(admin, keys: Keys, want: int, timeout: float = 30.0) -> list[Annotation]:
    deadline = time.monotonic() + timeout
    while True:
        got = [decode(e.data) for s in keys.annotation_streams for e in await admin.read(s, count=10_000)]
        if len(got) >= want:
            return got
        assert time.monotonic() < deadline, f"only {len(got)} of {want} annotations"
        await asyncio.sleep(0.05)


async def score(url: str, admin, keys: Keys, first: int, n: int) -> list[Annotation]:
    """Publish rollouts first..first+n-1 (as the admin, each to its group's partition) and have the SDK,
    connected as the restricted user, annotate them; every annotation so far."""
    for i in range(first, first + n):
        r = rollout(i, 1 + i % 16)
        await admin.add(keys.rollouts_for(r.group_id), encode(r))
    pb = await connect(url, retries=0)
    worker = ones(pb, RUN, P, claim_idle_ms=200, block_ms=50)
    task = asyncio.create_task(worker.run())
    try:
        got = await annotations(admin, keys, first + n)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 20)
        await pb.close()
    assert worker.heartbeats and worker.exit_code == 0  # Redis >= 7: its own heartbeat key is granted
    return got


@pytest.mark.timeout(240)
async def test_a_producer_user_works_on_every_node_through_a_restart_and_a_failover(tmp_path):
    with LocalCluster(tmp_path / "cluster") as cluster:
        keys, other = Keys(RUN, P, cluster=True), Keys(RUN + "-other", cluster=True)
        admin = await connect(cluster.url, retries=3)
        try:
            await admin.add(keys.prompts, b"p")
            await admin.set(keys.weights_latest, "secret")
            res = cli("producer", "add", "judge", "--run", RUN, "--partitions", str(P), "--broker", cluster.url)
            assert res.returncode == 0, res.stderr
            url = res.stdout.splitlines()[0]
            assert url.startswith(f"redis+cluster://producer-{RUN}-judge:") and url.count(",") == 5
            assert f"--partitions {P}" in res.stdout and "warning" not in res.stderr, res.stderr
            user = f"producer-{RUN}-judge"
            assert all(user in users_on(cluster, n.port) for n in cluster.nodes), "the user is on every node"
            for node in cluster.nodes:  # saved for a restart (CONFIG REWRITE), in a file still private
                conf = node.dir / "redis.conf"
                assert f"user {user} on" in conf.read_text() and conf.stat().st_mode & 0o077 == 0, conf
            # The groups are on the partition streams; no stream under an unpartitioned name was created.
            streams = await admin.scan(f"streamrl:{RUN}:*rollouts")
            assert sorted(streams) == sorted(keys.rollout_streams), streams
            listed = cli("producer", "list", "--run", RUN, "--broker", cluster.url)
            assert listed.stdout.split() == [user], listed

            got = await score(url, admin, keys, 0, 12)
            assert sorted(a.rollout_id for a in got) == sorted(rollout(i, 1).rollout_id for i in range(12))

            pb = await connect(url, retries=0)
            c = pb.client
            try:
                denied = [
                    c.get(keys.weights_latest),
                    c.set(keys.weights_latest, "x"),
                    c.xadd(keys.prompts, {"d": b"x"}),
                    c.xrange(keys.prompts),
                    c.xadd(other.annotations, {"d": b"x"}),
                    c.xrange(keys.annotation_streams[0]),
                    c.xadd(keys.rollout_streams[1], {"d": b"x"}),
                    c.delete(keys.rollout_streams[2]),
                    c.xgroup_destroy(keys.rollout_streams[0], "judge"),
                    c.set(keys.run_end, "{}"),
                    c.set(keys.worker("producer", "someone-else"), "{}"),
                    c.execute_command("CLUSTER", "NODES"),
                    c.execute_command("ACL", "LIST"),
                    c.config_get("*"),
                    c.flushall(),
                    c.keys("*"),
                ]
                for call in denied:
                    with pytest.raises(NoPermissionError):
                        await call
            finally:
                await pb.close()
            assert await admin.get(keys.weights_latest) == b"secret" and await admin.stream_len(keys.prompts) == 1

            # Kill the master of partition 0: its replica (holding the user since `add`) takes over; the killed
            # node restarts from its config file (CONFIG REWRITE saved the user there) as the new replica.
            owner = admin.client.nodes_manager.get_node_from_slot(admin.client.keyslot(keys.rollout_streams[0]))
            cluster.kill(owner.port)
            deadline = time.monotonic() + 60
            while len(cluster.masters()) < 3:
                assert time.monotonic() < deadline, "no replica was promoted"
                await asyncio.sleep(0.1)
            cluster.restart(owner.port)
            cluster.wait_ok(60)
            assert user in users_on(cluster, owner.port), "the restarted node lost the user"
            got = await score(url, admin, keys, 12, 12)
            assert len({a.rollout_id for a in got}) == 24

            res = cli("producer", "remove", "judge", "--run", RUN, "--broker", cluster.url)
            assert res.returncode == 0 and "removed 1 user(s)" in res.stdout, res.stderr
            assert not any(user in users_on(cluster, n.port) for n in cluster.nodes)
        finally:
            await admin.close()


async def test_a_producer_for_another_rollout_partitions_than_the_running_jobs_is_refused(redis_cluster):
    run = "acl-wrong"
    keys = Keys(run, P, cluster=True)
    admin = await connect(redis_cluster.url, retries=3)
    try:
        for s in keys.rollout_streams:  # a job with rollout.partitions=3 is running
            await admin.ensure_group(s, "trainer")
        res = cli("producer", "add", "judge", "--run", run, "--broker", redis_cluster.url)  # --partitions 1
        assert res.returncode != 0 and f"--partitions {P}" in res.stderr, res.stderr
        assert not await admin.scan(f"streamrl:{run}:{{{run}}}:rollouts"), "no stray stream"
    finally:
        await admin.close()


async def test_a_cluster_user_without_the_cluster_grant_is_told_the_noperm_and_the_rules(redis_cluster):
    run = "acl-bare"
    try:
        # A user made by hand with the single-server grant only (no CLUSTER SLOTS, COMMAND, CLUSTER INFO).
        # Then one with the slot map but not the command table (redis-py) nor CLUSTER INFO.
        user, pw = f"bare-{run}", "pw-bare-1234"
        seeds = ",".join(f"127.0.0.1:{n.port}" for n in redis_cluster.nodes)
        for extra in ([], ["+cluster|slots", "+cluster|shards"]):
            rules = ["reset", "on", f">{pw}", "-@all", "+ping", "+xreadgroup", "+xadd", "~*", *extra]
            for n in redis_cluster.nodes:
                with redis_cluster.client(n.port) as c:
                    c.execute_command("ACL", "SETUSER", user, *rules)
            with pytest.raises(BrokerError) as err:
                await connect(f"redis+cluster://{user}:{pw}@{seeds}", retries=1)
            text = str(err.value)
            assert "NOPERM" in text and "+cluster|slots" in text and "+command" in text, text
            assert "cluster-enabled no" not in text and "start the nodes" not in text, text
    finally:
        for n in redis_cluster.nodes:
            with redis_cluster.client(n.port) as c:
                c.execute_command("ACL", "DELUSER", f"bare-{run}")


async def test_an_env_user_on_a_cluster_is_on_every_node_with_its_keys_only(redis_cluster):
    run = "acl-env"
    keys = Keys(run, P, cluster=True)
    res = cli("envuser", "add", "node", "--run", run, "--broker", redis_cluster.url)
    assert res.returncode == 0, res.stderr
    assert all(f"env-{run}-node" in users_on(redis_cluster, n.port) for n in redis_cluster.nodes)
    eb = await connect(res.stdout.splitlines()[0], retries=0)
    try:
        env = Keys(run, cluster=True)
        assert [g["name"] for g in await eb.group_info(env.env_steps)] == ["env"]
        await eb.add(env.observations("generator-0"), b"x")
        with pytest.raises(NoPermissionError):
            await eb.client.xadd(keys.rollout_streams[0], {"d": b"x"})
    finally:
        await eb.close()
    assert cli("envuser", "remove", "node", "--run", run, "--broker", redis_cluster.url).returncode == 0


def test_the_embedded_server_keeps_its_config_private_when_a_user_is_saved(redis_server):
    res = cli("producer", "add", "judge", "--run", "acl-embedded", "--broker", redis_server.url)
    assert res.returncode == 0, res.stderr
    conf = redis_server.data_dir / "redis.conf"
    assert "user producer-acl-embedded-judge on" in conf.read_text() and conf.stat().st_mode & 0o077 == 0
    assert cli("producer", "remove", "judge", "--run", "acl-embedded", "--broker", redis_server.url).returncode == 0
