"""The cluster side of `streamrl bench broker --cluster --partitions 1,3`: per-node server CPU, and the
runs on a local Redis Cluster beside one standalone server.

    streamrl bench broker --cluster --partitions 1,3 --rollouts 8000
    streamrl bench broker --url redis+cluster://:PW@h1:7000,h2:7000,h3:7000 --partitions 3

Each node's `used_cpu_user + used_cpu_sys` (INFO cpu, forked children included) is read before and
after a run: a master's share is its command thread's work for the streams its slots hold; a
replica's is applying its master's replication stream. On 2 shared cores the nodes compete with the
roles for CPU, so rollouts/s cannot grow with P here; CPU per rollout per node is what carries over
to a cluster of real hosts (bench/broker_sizing.py projects from it).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import redis

from streamrl.core.broker_url import is_cluster_url, parse_cluster_url

CPU_KEYS = ("used_cpu_user", "used_cpu_sys", "used_cpu_user_children", "used_cpu_sys_children")


def _nodes(url: str) -> list[tuple[str, int, str | None]]:
    """(host, port, password) of every node of the cluster at `url` (masters and replicas)."""
    seeds, _, password = parse_cluster_url(url)
    for host, port in seeds:
        with contextlib.suppress(redis.RedisError), redis.Redis(host=host, port=port, password=password) as c:
            lines = c.execute_command("CLUSTER", "NODES")
            text = lines.decode() if isinstance(lines, bytes) else str(lines)
            out = []
            for line in text.splitlines():
                parts = line.split()
                if len(parts) > 2 and "fail" not in parts[2] and ":" in parts[1]:
                    addr = parts[1].split("@", 1)[0]
                    h, _, p = addr.rpartition(":")
                    out.append((h or host, int(p), password))
            return out
    raise RuntimeError(f"no seed of {url.split('@')[-1]} answered CLUSTER NODES; is the cluster up?")


@contextlib.contextmanager
def _each(url: str) -> Iterator[list[tuple[str, redis.Redis]]]:
    with contextlib.ExitStack() as stack:
        yield [(f"{h}:{p}", stack.enter_context(redis.Redis(host=h, port=p, password=pw))) for h, p, pw in _nodes(url)]


def node_stats(url: str, flush: bool = True) -> dict[str, dict]:
    """Per node ("host:port"): role, CPU seconds so far, AOF rewrites; then FLUSHALL on the masters."""
    out = {}
    with _each(url) as nodes:
        for name, c in nodes:
            info = {**c.info("cpu"), **c.info("persistence"), **c.info("replication")}
            out[name] = {
                "role": info.get("role"),
                "cpu_s": sum(float(info[k]) for k in CPU_KEYS),
                "aof_rewrites": int(info.get("aof_rewrites", 0)),
                "aof_mb": int(info.get("aof_current_size", 0)) / 1e6,
            }
        if flush:
            for name, c in nodes:
                if out[name]["role"] == "master":
                    c.flushall()
    return out


def per_node(before: dict[str, dict], after: dict[str, dict], rollouts: int) -> dict[str, dict]:
    """CPU seconds and microseconds per rollout of each node over one run, masters first."""
    rows = {}
    for name in sorted(after, key=lambda n: (after[n]["role"] != "master", n)):
        cpu = after[name]["cpu_s"] - before.get(name, {"cpu_s": after[name]["cpu_s"]})["cpu_s"]
        rows[name] = {
            "role": after[name]["role"],
            "cpu_s": round(cpu, 2),
            "us_per_rollout": round(cpu / max(1, rollouts) * 1e6, 1),
        }
    return rows


def totals(stats: dict[str, dict]) -> dict:
    """`_server_stats`'s shape (bench/broker.py) summed over the cluster's nodes."""
    return {
        "cpu_s": sum(s["cpu_s"] for s in stats.values()),
        "aof_rewrites": sum(s["aof_rewrites"] for s in stats.values()),
        "aof_mb": sum(s["aof_mb"] for s in stats.values()),
        "nodes": stats,
    }


def is_cluster(url: str) -> bool:
    return is_cluster_url(url)
