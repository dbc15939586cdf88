"""The Broker protocol on Redis Cluster (brokers/cluster.py) against the session's local cluster: calls that
span slots are split per slot, a script across slots is refused naming the fix, and a URL that is not a
cluster or names a node that is down fails at connect, before anything starts.

    pytest tests/integration/brokers/test_cluster_broker.py
"""

from __future__ import annotations

import socket

import pytest

from brokers.cluster import ClusterBroker, connect_cluster, slot_of
from brokers.connect import connect
from streamrl.core.errors import BrokerError

pytestmark = pytest.mark.anyio


@pytest.fixture
async def cluster_broker(redis_cluster):
    b = await connect(redis_cluster.url, retries=2)
    yield b
    await b.close()


def _two_slots(run: str) -> tuple[str, str]:
    a, b = f"t:{{{run}a}}:s", f"t:{{{run}b}}:s"
    assert slot_of(a) != slot_of(b)
    return a, b


async def test_read_and_ack_over_streams_in_two_slots(cluster_broker, run_name):
    assert isinstance(cluster_broker, ClusterBroker)
    a, b = _two_slots(run_name)
    for s in (a, b):
        await cluster_broker.ensure_group(s, "g")
    await cluster_broker.add_many(a, [b"1", b"2"])
    await cluster_broker.add(b, b"3")
    got = await cluster_broker.read_groups([a, b], "g", "c", block_ms=2000)
    assert {s: [e.data for e in es] for s, es in got.items()} == {a: [b"1", b"2"], b: [b"3"]}
    assert await cluster_broker.ack_many("g", {s: [e.id for e in es] for s, es in got.items()}) == 3
    assert [g["pending"] for s in (a, b) for g in await cluster_broker.group_info(s)] == [0, 0]
    added = await cluster_broker.add_and_ack(b, [b"x"], a, "g", [])
    assert [e.id for e in await cluster_broker.read(b)][-1:] == added
    assert set(await cluster_broker.scan(f"t:{{{run_name}*")) == {a, b}


async def test_blocking_read_over_two_slots_wakes_on_either(cluster_broker, run_name):
    a, b = _two_slots(run_name)
    for s in (a, b):
        await cluster_broker.ensure_group(s, "g")
    await cluster_broker.add(b, b"late")
    got = await cluster_broker.read_groups([a, b], "g", "c", block_ms=5000)
    assert [e.data for e in got[b]] == [b"late"] and a not in got
    assert await cluster_broker.read_groups([a, b], "g", "c", block_ms=50) == {}


async def test_script_across_slots_is_refused_naming_the_fix(cluster_broker, run_name):
    a, b = _two_slots(run_name)
    src = "return redis.call('INCR', KEYS[1])"
    assert await cluster_broker.script(src, [a + "n", a + "m"], []) == 1  # one tag: one slot
    with pytest.raises(BrokerError, match=r"hash tag"):
        await cluster_broker.script(src, [a, b], [])


async def test_a_single_server_behind_a_cluster_url_names_the_fix(redis_server):
    url = f"redis+cluster://:{redis_server.password}@127.0.0.1:{redis_server.port}"
    with pytest.raises(BrokerError, match=r"without cluster mode.*redis://"):
        await connect(url, retries=0)


async def test_a_node_down_at_start_is_named(redis_cluster):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    url = redis_cluster.url + f",127.0.0.1:{dead}"
    with pytest.raises(BrokerError, match=rf"127.0.0.1:{dead} \(named in broker.url, unreachable\).*start the nodes"):
        await connect_cluster(url, retries=0, strict=True)
    await (await connect(url, retries=0)).close()  # a role joining mid-job: the masters serve every slot


async def test_a_malformed_cluster_url_names_the_form():
    with pytest.raises(BrokerError, match="HOST:PORT"):
        await connect("redis+cluster://:pw@hostonly", retries=0)


# A killed node of the slot map named at start: test_cluster_failover_wait.py (on its cluster, after its
# failover), so that no test here starts a cluster of its own.


def test_a_cross_slot_key_layout_is_refused_before_the_job_starts():
    from brokers.cluster import check_slots
    from streamrl.core.broker import Keys

    check_slots(Keys("job", 3, cluster=True))  # the cluster layout: every set in one slot
    with pytest.raises(BrokerError, match=r"hash to slots .*cluster=True"):
        check_slots(Keys("job", 3, cluster=False))  # the single-server names on a cluster


def test_preflight_names_a_broken_cluster_url(config, redis_server, redis_cluster):
    from streamrl.launch.preflight import check_broker

    cfg = config.model_copy(deep=True)
    cfg.broker.url = redis_cluster.url
    assert check_broker(cfg) is None
    cfg.broker.url = f"redis+cluster://:{redis_server.password}@127.0.0.1:{redis_server.port}"
    assert "without cluster mode" in check_broker(cfg)
