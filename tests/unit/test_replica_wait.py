"""brokers/replica_wait.py's pure parts: which replicas count, and the marker key's slot."""

from __future__ import annotations

from redis.crc import key_slot

from brokers.replica_wait import online_replicas, touch_key


def test_only_online_replicas_count():
    info = {
        "role": "master",
        "connected_slaves": 2,
        "slave0": {"ip": "127.0.0.1", "port": 1, "state": "online", "offset": 10, "lag": 0},
        "slave1": {"ip": "127.0.0.1", "port": 2, "state": "wait_bgsave", "offset": 0, "lag": 0},
        "slave_read_only": 1,
    }
    assert online_replicas(info) == 1
    assert online_replicas({"role": "master", "connected_slaves": 0}) == 0


def test_the_marker_shares_the_keys_slot():
    for key, cluster in [
        ("streamrl:r:{p3}:rollouts", True),
        ("streamrl:r:ledger:groups", True),
        ("streamrl:r:ledger:groups", False),
    ]:
        marker = touch_key(key, cluster)
        assert marker != key
        if cluster:
            assert key_slot(marker.encode()) == key_slot(key.encode()), (key, marker)
    assert touch_key("streamrl:r:{p3}:rollouts", True).startswith("streamrl:r:")


def test_uvloop_closed_transport_counts_as_a_connection_error():
    from redis.exceptions import ConnectionError as RedisConnectionError

    from brokers.replica_wait import transient

    assert transient(RuntimeError("unable to perform operation on <TCPTransport closed=True>; the handler is closed"))
    assert transient(RedisConnectionError("Error 111 connecting"))
    assert not transient(RuntimeError("something else"))
    assert not transient(ValueError("bad"))
