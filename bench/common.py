"""Helpers the benchmarks share: a throw-away redis-server, role processes, tables, result files.

    from bench.common import scratch_servers, spawn, print_table, write_result
    with scratch_servers() as urls: ...

Every role of a bench runs in its own process (multiprocessing, fork), so on a small machine
the numbers include the real cost of each process competing for cores, as in a real job.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from streamrl.report.plotting import pyplot  # noqa: F401  (bench modules take it from here)

_CTX = mp.get_context("fork")


@dataclass(frozen=True)
class Servers:
    """Where a bench's roles connect: the broker URL (a server or a cluster: brokers/connect.py), first of `urls`."""

    urls: tuple[str, ...]
    wait_replicas: int = 0
    """broker.wait_replicas of every role (brokers/replica_wait.py)."""

    async def connect(self):
        from brokers.connect import connect
        from brokers.replica_wait import ReplicaWait

        return await connect(self.urls[0], durable=ReplicaWait(self.wait_replicas))


@contextlib.contextmanager
def scratch_servers(
    urls: list[str] | None = None, count: int = 1, name: str = "bench", local: bool = True
) -> Iterator[list[str]]:
    """Yield `urls` if given, else the URLs of `count` private EmbeddedRedis servers (the production
    embedded config, AOF included) in temporary directories, stopped and deleted afterwards: their unix
    sockets' URLs, as `streamrl up` hands its roles (`local=False`: TCP)."""
    if urls:
        yield list(urls)
        return
    from brokers.embedded import EmbeddedRedis

    with contextlib.ExitStack() as stack:
        out = []
        for _ in range(count):
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"streamrl-{name}-"))
            server = stack.enter_context(EmbeddedRedis(Path(tmp)))
            out.append(server.local_url if local else server.url)
        yield out


def quiet_logging(role: str) -> None:
    """Warnings only from a bench child process (a started/stopped line per role would clutter the table)."""
    from streamrl.core.logs import setup_logging

    setup_logging(role, role, None, level="warning")


def _child(target: Callable, args: tuple) -> None:
    # A forked child must not inherit the parent's signal handlers; SIGTERM stops it (see serve_worker).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    target(*args)


def spawn(target: Callable, *args: Any) -> mp.Process:
    """Start `target(*args)` in a forked process."""
    p = _CTX.Process(target=_child, args=(target, args), daemon=True)
    p.start()
    return p


def queue() -> mp.Queue:
    return _CTX.Queue()


def stop_all(procs: list[mp.Process], grace_s: float = 10.0) -> None:
    """SIGTERM each (a Worker drains its step and exits), then SIGKILL what is left after `grace_s`."""
    for p in procs:
        if p.is_alive():
            os.kill(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def serve_worker(factory: Callable, servers: Servers) -> None:
    """Run one Worker built by `factory(broker)` until SIGTERM (or until it sets `done`)."""

    async def main() -> None:
        broker = await servers.connect()
        worker = factory(broker)
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, worker.stop)
        try:
            await worker.run()
        finally:
            await broker.close()

    run_async(main())


def run_async(coro) -> Any:
    """Run a coroutine on uvloop (the production loop) when installed."""
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def percentiles_ms(seconds: list[float] | np.ndarray) -> dict[str, float]:
    a = np.asarray(seconds, dtype=np.float64) * 1000
    if a.size == 0:
        return {"p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
    return {
        "p50_ms": round(float(np.percentile(a, 50)), 3),
        "p99_ms": round(float(np.percentile(a, 99)), 3),
        "max_ms": round(float(a.max()), 3),
    }


def load_average() -> list[float]:
    """1/5/15-minute load averages: other work on the machine skews every number, so results carry it."""
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict:
    return {"cpus": os.cpu_count(), "load_avg": load_average(), "platform": os.uname().machine}


def format_table(rows: list[dict], cols: list[str]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"
        return str(v)

    body = [[cell(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(b[i]) for b in body)) if body else len(c) for i, c in enumerate(cols)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.rjust(w) for v, w in zip(b, widths)) for b in body]
    return "\n".join(lines)


def print_table(rows: list[dict], cols: list[str], title: str = "") -> None:
    if title:
        print(title)
    print(format_table(rows, cols))


def write_result(out: str | None, result: dict) -> Path | None:
    """Write OUT/result.json (creating OUT); None without --out."""
    if not out:
        return None
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    (path / "result.json").write_text(json.dumps(result, indent=2, default=float) + "\n")
    return path / "result.json"
