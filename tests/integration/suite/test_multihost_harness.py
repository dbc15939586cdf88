"""tests/multihost.py, the multi-host rehearsal's namespaces: each host reaches the broker on the
bridge and has its own loopback, and everything is torn down even when the body fails.

    sudo pytest tests/integration/suite/test_multihost_harness.py
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.multihost import hosts, skip_or_fail_without_netns, start_broker


@pytest.fixture(autouse=True)
def _netns_here():
    skip_or_fail_without_netns()


def _names() -> str:
    return (
        subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        + subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    )


def test_hosts_reach_the_broker_over_the_bridge_only_and_are_torn_down_on_failure(tmp_path):
    probe = "import redis, sys; print(redis.Redis.from_url(sys.argv[1], socket_connect_timeout=2).ping())"
    with pytest.raises(RuntimeError, match="the body failed"):
        with hosts(["a", "b"]) as net:
            broker = start_broker(net.gateway, tmp_path / "broker")
            try:
                tag = net.tag
                sleeper = net.popen("a", [sys.executable, "-c", "import time; time.sleep(600)"], tmp_path / "s.log")
                for host in ("a", "b"):
                    res = net.run(host, [sys.executable, "-c", probe, broker.url])
                    assert res.stdout.strip() == "True", res.stderr
                loopback = broker.url.replace(net.gateway, "127.0.0.1")
                assert net.run("a", [sys.executable, "-c", probe, loopback]).returncode != 0  # its own loopback
                assert net.addr["a"] != net.addr["b"]
                raise RuntimeError("the body failed")
            finally:
                broker.stop()
    assert sleeper.poll() is not None  # what ran inside was ended
    assert tag not in _names()  # namespaces, veths and the bridge are gone
