"""Hosts on one machine for the multi-host rehearsal (tests/e2e/test_multihost.py, docs/multihost.md):
each "host" is a network namespace with its own loopback and one veth to a bridge in the root
namespace; the broker (a Redis Cluster, or one server) listens on the bridge's address only, so every role reaches it over a veth,
as over a network. Needs root and iproute2 (`ip netns`); CI has both.

    with hosts(["trainer", "gen", "workers"]) as net:
        cluster = start_cluster(net.gateway, tmp / "cluster")   # Redis Cluster on the bridge address
        broker = start_broker(net.gateway, tmp / "broker")      # or one standalone server
        proc = net.popen("gen", ["streamrl", "worker", "generator", ...], log_path)

Names carry a random tag per run (namespaces srl-<tag>-<host>, links s<tag>...), so runs never
collide; everything is torn down when the `with` block ends, whatever happened inside it.
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import signal
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import redis


def unavailable() -> str:
    """Why network namespaces cannot be made here ("" when they can)."""
    if os.geteuid() != 0:
        return "the multi-host rehearsal needs root (network namespaces)"
    if not shutil.which("ip"):
        return "the multi-host rehearsal needs iproute2 (`ip netns`; apt install iproute2)"
    return ""


def skip_or_fail_without_netns() -> None:
    """In a test: skip where namespaces cannot be made, fail instead under STREAMRL_REQUIRE_NETNS=1 (CI)."""
    import pytest

    if why := unavailable():
        if os.environ.get("STREAMRL_REQUIRE_NETNS") == "1":
            pytest.fail(f"STREAMRL_REQUIRE_NETNS=1 but {why}")
        pytest.skip(why)


def _ip(*args: str) -> None:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {res.stderr.strip()}")


def _free_subnet() -> str:
    """A 10.x.y.0/24 prefix no route of this machine uses."""
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    for _ in range(100):
        prefix = f"10.{random.randint(64, 250)}.{random.randint(0, 255)}."
        if prefix not in routes:
            return prefix
    raise RuntimeError("no free 10.x.y.0/24 subnet for the rehearsal's bridge")


@dataclass
class Net:
    tag: str
    gateway: str
    """The bridge's address in the root namespace: where the broker listens."""
    bridge: str
    ns: dict[str, str] = field(default_factory=dict)
    """host name -> network namespace."""
    addr: dict[str, str] = field(default_factory=dict)
    """host name -> its veth address."""
    procs: list[subprocess.Popen] = field(default_factory=list)

    def popen(self, host: str, argv: list[str], log: Path, env: dict | None = None, cwd=None) -> subprocess.Popen:
        """Start `argv` inside `host`'s namespace, its output appended to `log`."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", self.ns[host], *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,  # its own process group: a teardown kill reaches its children
            )
        self.procs.append(proc)
        return proc

    def run(self, host: str, argv: list[str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ip", "netns", "exec", self.ns[host], *argv], capture_output=True, text=True, timeout=timeout, **kw
        )

    def teardown(self) -> None:
        for proc in self.procs:  # what this harness started, by process group
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=30)
        for name in self.ns.values():
            # Anything still inside descends from what this harness started there (e.g. a vLLM engine
            # process that left its process group).
            pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        # A namespace goes (with its veth end) only once its last process has exited, which a SIGKILL
        # does not wait for: delete each pair by its root-side end now (deleting one end deletes both).
        for i in range(len(self.ns)):
            subprocess.run(["ip", "link", "del", f"s{self.tag}{i}a"], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30)


@contextmanager
def hosts(names: list[str]):
    """Namespaces `names`, each reaching the root namespace's bridge (and only it) over a veth."""
    tag = secrets.token_hex(3)
    prefix = _free_subnet()
    net = Net(tag=tag, gateway=prefix + "1", bridge=f"s{tag}br")
    try:
        _ip("link", "add", net.bridge, "type", "bridge")
        _ip("addr", "add", net.gateway + "/24", "dev", net.bridge)
        _ip("link", "set", net.bridge, "up")
        for i, host in enumerate(names):
            ns, outer, inner = f"srl-{tag}-{host}", f"s{tag}{i}a", f"s{tag}{i}b"
            _ip("netns", "add", ns)
            net.ns[host] = ns
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", ns)
            _ip("link", "set", outer, "master", net.bridge, "up")
            net.addr[host] = f"{prefix}{10 + i}"
            _ip("-n", ns, "addr", "add", net.addr[host] + "/24", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "up")
            _ip("-n", ns, "link", "set", "lo", "up")  # its own loopback (vLLM, torch talk to themselves there)
            # A default route, as a host has: libraries find "their" address by routing towards the
            # internet (nothing is forwarded past the bridge).
            _ip("-n", ns, "route", "add", "default", "via", net.gateway)
        yield net
    finally:
        net.teardown()


@dataclass
class Broker:
    url: str
    proc: subprocess.Popen

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_broker(address: str, data_dir: Path, port: int = 6379) -> Broker:
    """A standalone redis-server with a password and AOF, listening on `address` only.
    The rehearsal needs nothing from it but its URL (a Redis Cluster's `redis+cluster://` would do)."""
    binary = shutil.which("redis-server") or shutil.which("valkey-server")
    if binary is None:
        raise RuntimeError("the multi-host rehearsal needs redis-server on PATH (apt install redis-server)")
    data_dir.mkdir(parents=True, exist_ok=True)
    password = secrets.token_hex(12)
    args = ["--bind", address, "--port", str(port), "--requirepass", password, "--appendonly", "yes"]
    args += ["--dir", str(data_dir), "--save", "", "--daemonize", "no"]
    with open(data_dir / "redis.log", "ab") as out:
        proc = subprocess.Popen([binary, *args], stdout=out, stderr=subprocess.STDOUT)
    url = f"redis://:{password}@{address}:{port}/0"
    deadline = time.monotonic() + 30
    while True:
        try:
            redis.Redis.from_url(url, socket_connect_timeout=1).ping()
            return Broker(url, proc)
        except redis.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                log = (data_dir / "redis.log").read_text()
                raise RuntimeError(f"redis-server on {address}:{port} did not start: {log}") from None
            time.sleep(0.1)


def start_cluster(address: str, data_dir: Path):
    """A 3-master, 3-replica Redis Cluster (brokers/local_cluster.py) listening on `address` only:
    `.url` is its redis+cluster:// seed list, `.stop()` ends it. The nodes announce that address,
    so a client in a namespace is redirected to nodes it can reach."""
    from brokers.local_cluster import LocalCluster

    return LocalCluster(data_dir, masters=3, replicas=1, host=address).start()
