"""Redis Cluster broker URLs: `redis+cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]`, parsed, and a
synchronous client for either kind of URL (the accounting check, `up`'s run-end mark, the preflight).

The listed nodes are seeds: the client asks any one of them for the cluster's map and then talks to
every node it names, so one live seed is enough to connect (brokers/cluster.py refuses to start while
a node of the cluster is down). `rediss+cluster://` is the same over TLS.

    seeds, user, password = parse_cluster_url("redis+cluster://:pw@10.0.0.1:7000,10.0.0.2:7000")
    with sync_client(url) as r: r.get(key)   # redis.Redis or redis.cluster.RedisCluster
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from streamrl.core.errors import BrokerError

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
CLUSTER_FORM = "redis+cluster://:PASSWORD@HOST1:PORT,HOST2:PORT,HOST3:PORT"


def is_cluster_url(url: str) -> bool:
    return url.split("://", 1)[0] in CLUSTER_SCHEMES


def parse_cluster_url(url: str) -> tuple[list[tuple[str, int]], str | None, str | None]:
    """(seed nodes, username, password) of a cluster URL; a malformed one raises BrokerError naming the form."""
    scheme, sep, rest = url.partition("://")
    if scheme not in CLUSTER_SCHEMES or not sep:
        raise BrokerError(f"{redact_cluster(url)} is not a cluster URL; use {CLUSTER_FORM}")
    rest = rest.split("?", 1)[0].split("/", 1)[0]
    creds, _, hosts = rest.rpartition("@")
    user, _, password = creds.partition(":") if creds else ("", "", "")
    seeds = []
    for item in filter(None, hosts.split(",")):
        host, _, port = item.rpartition(":")
        host = host.strip("[]")  # an IPv6 literal in brackets
        if not host or not port.isdigit():
            raise BrokerError(
                f"cluster URL {redact_cluster(url)}: {item!r} is not HOST:PORT; list the seed nodes as {CLUSTER_FORM}"
            )
        seeds.append((host, int(port)))
    if not seeds:
        raise BrokerError(f"cluster URL {redact_cluster(url)} names no node; use {CLUSTER_FORM}")
    return seeds, unquote(user) or None, unquote(password) if password else None


def redact_cluster(url: str) -> str:
    """The URL with its password replaced by `***`."""
    scheme, sep, rest = url.partition("://")
    creds, at, hosts = rest.rpartition("@")
    if not at or ":" not in creds:
        return url
    return f"{scheme}{sep}{creds.split(':', 1)[0]}:***@{hosts}"


def sync_client(url: str, **options: Any):
    """A blocking redis-py client of `url`: RedisCluster for a cluster URL, else Redis.from_url."""
    import redis
    from redis.cluster import ClusterNode, RedisCluster

    if not is_cluster_url(url):
        return redis.Redis.from_url(url, **options)
    seeds, user, password = parse_cluster_url(url)
    return RedisCluster(
        startup_nodes=[ClusterNode(h, p) for h, p in seeds],
        username=user,
        password=password,
        ssl=url.startswith("rediss+"),
        **options,
    )
