"""Broker users (Redis ACL) on every node that may serve a run, kept across node restarts.

    nodes = await acl_nodes(broker, admin_url)         # the one server, or every node of a cluster
    replies, notes = await on_every_node(nodes, "ACL", "SETUSER", user, *rules)
    await close_nodes(nodes)

Redis keeps ACL users per node: on a cluster a user set on one node is unknown to the others (masters
serving the other slots, and the replicas that take over after a failover), so `streamrl producer add`
and `streamrl envuser add` set it on each node, masters and replicas. Users set with ACL SETUSER live in
memory only; each node then saves them the way it is configured: `ACL SAVE` when it runs with an
`aclfile`, else `CONFIG REWRITE` into the config file it was started with (the local cluster's
nodes, brokers/local_cluster.py). A node that can do neither (started without a config file, or a
managed service that refuses CONFIG) is named in the notes returned: its users vanish when it restarts.
docs/protocol.md, "Access control", says the same for a user's own cluster.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from streamrl.core.broker_url import parse_cluster_url
from streamrl.core.errors import BrokerError

CLUSTER_COMMANDS = ["cluster|slots", "cluster|shards", "cluster|info", "command", "asking"]
"""What a cluster client runs besides its own commands, granted to every restricted user on a cluster: the
slot map (CLUSTER SLOTS: redis-py, ioredis, node-redis; CLUSTER SHARDS: newer clients), CLUSTER INFO
(ioredis' ready check, streamrl's connect check), the command table (COMMAND, COMMAND GETKEYS: redis-py
finds a command's keys with it) and ASKING (a slot being migrated). None of them reads or writes a key."""


def cluster_grant_hint() -> str:
    """The ACL rules a cluster client's user needs, as an `ACL SETUSER` argument list."""
    return " ".join(f"+{c}" for c in CLUSTER_COMMANDS)


@dataclass
class AclNode:
    name: str
    """host:port (or the single server's URL, redacted)."""
    client: Any
    own: bool = False
    """The client was opened here (closed by close_nodes); False: the broker's own client."""


async def acl_nodes(broker, url: str) -> list[AclNode]:
    """The nodes a user must exist on: the broker's server, or every node of its cluster (replicas too;
    `url`, the broker's admin URL, gives their credentials).
    A cluster node marked failed raises BrokerError: a user missing there would be refused once it is back."""
    if not getattr(broker, "cluster", False):
        return [AclNode(broker.url, broker.client)]
    _, user, password = parse_cluster_url(url)
    nodes, down = [], []
    for addr, info in (await broker.client.cluster_nodes()).items():  # every node the cluster knows
        addr, flags = addr.split("@")[0], str(info.get("flags", ""))
        host, _, port = addr.rpartition(":")
        if "noaddr" in flags or not port.isdigit():
            continue
        if "fail" in flags.split(",") or not (info.get("connected") or "myself" in flags):
            down.append(f"{addr} ({flags})")
            continue
        client = aioredis.Redis(
            host=host,
            port=int(port),
            username=user,
            password=password,
            ssl=url.startswith("rediss+"),
            socket_connect_timeout=5,
            socket_timeout=10,
        )
        nodes.append(AclNode(addr, client, own=True))
    if down or not nodes:
        await close_nodes(nodes)
        which = ", ".join(down) or "(none listed by CLUSTER NODES)"
        raise BrokerError(
            f"cluster node(s) {which} are down: a broker user set now would be missing there once they are "
            "back (and refused after a failover to them). Start them (or remove a node gone for good: "
            "`redis-cli --cluster del-node`), then run the command again"
        )
    return nodes


async def close_nodes(nodes: list[AclNode]) -> None:
    for node in nodes:
        if node.own:
            with contextlib.suppress(RedisError, OSError):
                await node.client.aclose()


async def on_every_node(nodes: list[AclNode], *command: Any) -> tuple[list[Any], list[str]]:
    """Run `command` on each node, then persist the node's users; (each node's reply, notes on nodes whose
    users are not persisted)."""
    replies, notes = [], []
    for node in nodes:
        replies.append(await node.client.execute_command(*command))
        if note := await _persist(node):
            notes.append(note)
    return replies, notes


async def _persist(node: AclNode) -> str | None:
    """Save the node's users where it will read them at its next start; a note when it cannot."""
    try:
        found = await node.client.config_get("aclfile")
        aclfile = next(iter(found.values()), b"") if found else b""
        if aclfile:
            await node.client.execute_command("ACL", "SAVE")
        else:
            await node.client.execute_command("CONFIG", "REWRITE")
        return None
    except ResponseError as exc:
        return (
            f"{node.name}: the user is not persisted ({exc}); it vanishes when that node restarts. Start the "
            "node with an `aclfile` (users then saved with ACL SAVE) or from a config file (CONFIG REWRITE), "
            "or run the command again after each restart"
        )
