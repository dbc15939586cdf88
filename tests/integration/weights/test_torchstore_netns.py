"""`weights.backend: torchstore` across two hosts: network namespaces "trainer" and "gen" (tests/multihost.py),
the broker on the bridge between them. The publisher (bench/weights_torchstore.py `publish`: a real
TorchStorePublisher) serves on the trainer's veth address only; a reader started independently in "gen"
reads the newest version over TCP; a reader that announces an address the trainer cannot route to
fails with an error naming the setting, not a hang. Root and iproute2 (`ip netns`), like the rehearsal.

    sudo pytest tests/integration/weights/test_torchstore_netns.py
"""

from __future__ import annotations

import random
import subprocess
import time
import uuid

import pytest

from bench.weights_torchstore import ROOT, argv, next_event
from tests.multihost import hosts, skip_or_fail_without_netns, start_broker

pytest.importorskip("torchstore", reason="the torchstore extra is not installed (make setup installs it)")

SIZE, TENSOR = 1 << 20, 1 << 18


def _popen(net, host: str, args: list[str], stdin: bool = False) -> subprocess.Popen:
    proc = subprocess.Popen(
        ["ip", "netns", "exec", net.ns[host], *args],
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        cwd=ROOT,
        start_new_session=True,
    )
    net.procs.append(proc)  # killed at teardown, with everything left in the namespaces
    return proc


def _tcp_listeners(net, host: str) -> set[str]:
    out = net.run(host, ["ss", "-Hltn"]).stdout
    return {line.split()[3] for line in out.splitlines() if line.strip()}


@pytest.mark.timeout(300)
def test_a_reader_in_another_namespace_reads_the_trainers_store(tmp_path):
    skip_or_fail_without_netns()
    run = f"ts-netns-{uuid.uuid4().hex[:6]}"
    port = random.randint(20000, 29999)
    deadline = time.monotonic() + 240
    with hosts(["trainer", "gen"]) as net:
        broker = start_broker(net.gateway, tmp_path / "broker")
        try:
            trainer, gen = net.addr["trainer"], net.addr["gen"]
            url = broker.url
            pub = _popen(
                net, "trainer", argv("publish", url, run, trainer, port=port, bytes=SIZE, tensor_bytes=TENSOR), True
            )
            reader = _popen(net, "gen", argv("read", url, run, gen, versions=2, wait_stdin=True), True)
            # Announces 127.0.0.1: the store's replies would go to the trainer's own loopback.
            lost = _popen(net, "gen", argv("read", url, run, "127.0.0.1", connect_timeout=5, wait_stdin=True), True)
            next_event(pub, "started", deadline)
            for v in (1, 2):
                pub.stdin.write(f"{v}\n")
                next_event(pub, "published", deadline)
            # The store's one TCP listener is the configured address and port (its child processes use
            # unix sockets); nothing on the trainer's other addresses.
            assert _tcp_listeners(net, "trainer") == {f"{trainer}:{port}"}
            for proc in (reader, lost):
                next_event(proc, "waiting", deadline)
                proc.stdin.write("go\n")
            assert next_event(reader, "ready", deadline)["version"] == 2  # joined late: the newest
            pub.stdin.write("3\n")
            next_event(pub, "published", deadline)
            assert next_event(reader, "ready", deadline)["version"] == 3
            assert reader.wait(timeout=60) == 0
            out, _ = lost.communicate(timeout=120)
            assert lost.returncode != 0
            assert "did not answer in 5 s" in out and "weights.torchstore_addr" in out, out[-3000:]
            assert f"{trainer}:{port}" in out  # the address it could not reach
        finally:
            broker.stop()
