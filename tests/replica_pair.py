"""A redis-server master and its replica on loopback, the replica fed through a proxy that can freeze.

Replication is asynchronous: what a master acked but had not sent yet is lost when it dies and its
replica is promoted. On loopback the window is too short to hit by chance, so the replica reaches
its master through `LinkProxy`: `freeze()` stops the master's bytes (they are held, never
delivered), which is exactly a replica lagging behind at the moment of the kill.

    async with ReplicaPair(tmp_path) as pair:
        pair.proxy.freeze(); ...; pair.kill_master(); pair.promote()
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import redis

from brokers.local_cluster import _free_ports

SERVER = "/usr/bin/redis-server"


class LinkProxy:
    """TCP proxy replica -> master; while frozen, the master's bytes are not read (the replica lags)."""

    def __init__(self, master_port: int):
        self.master_port = master_port
        self.port = 0
        self._open = asyncio.Event()
        self._open.set()
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._links: set[asyncio.Task] = set()

    async def start(self) -> None:
        def link(r_in: asyncio.StreamReader, w_in: asyncio.StreamWriter) -> None:
            self._links.add(asyncio.get_running_loop().create_task(self._link(r_in, w_in)))

        self._server = await asyncio.start_server(link, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def freeze(self) -> None:
        self._open.clear()

    async def _link(self, r_in: asyncio.StreamReader, w_in: asyncio.StreamWriter) -> None:
        r_out, w_out = await asyncio.open_connection("127.0.0.1", self.master_port)
        self._writers += [w_in, w_out]

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, gated: bool) -> None:
            while data := await src.read(65536):
                if gated:
                    await self._open.wait()
                dst.write(data)
                await dst.drain()
            dst.close()

        await asyncio.gather(pump(r_in, w_out, False), pump(r_out, w_in, True), return_exceptions=True)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in self._writers:  # drop what a frozen link holds: the master is gone
            w.transport.abort()
        for task in self._links:
            task.cancel()
        await asyncio.gather(*self._links, return_exceptions=True)


class ReplicaPair:
    """Start a master (no persistence: what the replica has is all that survives) and a replica."""

    def __init__(self, data_dir: Path, proxy: bool = True):
        self.dir = data_dir
        self.via_proxy = proxy
        """False: the replica connects to the master directly (no freeze; for measuring WAIT's cost)."""
        self.master_port, self.replica_port = _free_ports("127.0.0.1", 2)
        self.procs: dict[int, subprocess.Popen] = {}
        self.proxy = LinkProxy(self.master_port)

    def _start(self, port: int, *extra: str) -> None:
        d = self.dir / str(port)
        d.mkdir(parents=True, exist_ok=True)
        args = [SERVER, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d), "--save", "", *extra]
        self.procs[port] = subprocess.Popen(
            args, stdout=open(d / "log", "ab"), stderr=subprocess.STDOUT, start_new_session=True
        )

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=5)

    async def __aenter__(self) -> "ReplicaPair":
        self._start(self.master_port)
        await self.proxy.start()
        upstream = self.proxy.port if self.via_proxy else self.master_port
        self._start(self.replica_port, "--replicaof", "127.0.0.1", str(upstream))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                info = self.client(self.master_port).info("replication")
                if info.get("slave0", {}).get("state") == "online":
                    return self
            except redis.RedisError:
                pass
            await asyncio.sleep(0.05)
        raise RuntimeError(f"the replica did not sync in 30 s; see {self.dir}/*/log")

    def kill(self, port: int) -> None:
        os.kill(self.procs[port].pid, signal.SIGKILL)
        self.procs[port].wait()

    async def fail_over(self) -> redis.Redis:
        """SIGKILL the master, cut the link and promote the replica (REPLICAOF NO ONE); return its client."""
        self.kill(self.master_port)
        await self.proxy.close()
        replica = self.client(self.replica_port)
        replica.replicaof("NO", "ONE")
        return replica

    async def __aexit__(self, *exc) -> None:
        await self.proxy.close()
        for port, proc in self.procs.items():
            if proc.poll() is None:
                self.kill(port)
