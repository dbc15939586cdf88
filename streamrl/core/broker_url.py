"""Redis Cluster broker URLs: `redis+cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]`, parsed, and a
synchronous client for either kind of URL (the accounting check, `up`'s run-end mark, the preflight).

The listed nodes are seeds: the client asks any one of them for the cluster's map and then talks to
every node it names, so one live seed is enough to connect (brokers/cluster.py refuses to start while
a node of the cluster is down). `rediss+cluster://` is the same over TLS.

    seeds, user, password = parse_cluster_url("redis+cluster://:pw@10.0.0.1:7000,10.0.0.2:7000")
    with sync_client(url) as r: r.get(key)   # redis.Redis or redis.cluster.RedisCluster

Passwords in URLs of every kind (redis://, rediss://, unix://, cluster): `redact_url` for anything shown
or written, `split_password` / `with_password` to keep one out of a file and put it back to connect.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, unquote

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
    return redact_url(url)


_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*")


def _creds(url: str) -> tuple[str, str, str, str] | None:
    """(scheme://, user, password, the rest after `@`) of a URL whose credentials hold a password."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    # The credentials end at the last `@` before the path (unix://:PW@/path: the path starts the rest).
    head = rest.split("/", 1)[0].split("?", 1)[0]
    creds, at, _ = head.rpartition("@")
    if not at or ":" not in creds:
        return None
    user, _, password = creds.partition(":")
    return scheme + sep, user, password, rest[len(creds) + 1 :]


def redact_url(url: str) -> str:
    """The URL with its password (in the credentials or a `password=` query) replaced by `***`."""
    parts = _creds(url)
    if parts is not None:
        url = f"{parts[0]}{parts[1]}:***@{parts[3]}"
    return _QUERY_PASSWORD.sub(r"\1***", url)


def split_password(url: str) -> tuple[str, str | None]:
    """(the URL without its password, the password or None): what may be written, and the secret."""
    parts = _creds(url)
    if parts is not None:
        scheme, user, password, rest = parts
        return f"{scheme}{user + '@' if user else ''}{rest}", unquote(password)
    found = _QUERY_PASSWORD.search(url)
    if found is None:
        return url, None
    password = unquote(found.group(0).split("=", 1)[1])
    head = found.group(1)[0]
    stripped = url[: found.start()] + (head if head == "?" else "") + url[found.end() :]
    return stripped.replace("?&", "?").rstrip("?"), password


def with_password(url: str, password: str) -> str:
    """`url` (which holds no password) with `password` in its credentials, kept with its user if any."""
    scheme, sep, rest = url.partition("://")
    head = rest.split("/", 1)[0].split("?", 1)[0]
    user, at, _ = head.rpartition("@")
    tail = rest[len(user) + 1 :] if at else rest
    return f"{scheme}{sep}{user}:{quote(password, safe='')}@{tail}"


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
