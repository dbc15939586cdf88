"""What `streamrl producer` and `streamrl envuser` share: a run's restricted broker users (Redis ACL),
created with their consumer group, listed and removed through the admin URL, and the arguments that say which.

A user lives on every node that may serve the run (on a cluster: every master and replica) and is
saved where each node reads it at restart (brokers/acl.py); on a cluster it may also ask for the
slot map and the command table, which cluster clients read before their first command
(brokers.acl.CLUSTER_COMMANDS).
"""

from __future__ import annotations

import re
import secrets
import sys
from typing import Any, Awaitable, Callable
from urllib.parse import quote, urlsplit, urlunsplit

from streamrl.commands.common import add_broker_arg, run_dir_config
from streamrl.core.broker import Keys
from streamrl.core.broker_url import is_cluster_url
from streamrl.core.errors import ConfigError


def cluster_grant(keys: Keys) -> list[str]:
    """brokers.acl.CLUSTER_COMMANDS as ACL rules for a user of a run laid out as `keys` (none on one server)."""
    from brokers.acl import CLUSTER_COMMANDS

    return [f"+{c}" for c in CLUSTER_COMMANDS] if keys.cluster else []


def add_arguments(p, name_help: str, partitioned: bool = True) -> None:
    """The action, the user's NAME and where the run's broker is: the same for every kind of user
    (`partitioned`: its keys are the partitioned `rollouts`/`annotations`, --partitions says how many)."""
    p.add_argument("action", choices=["add", "remove", "list"])
    p.add_argument("name", nargs="?", help=name_help)
    p.add_argument("--run", required=True, help="run name (run.name of the job)")
    add_broker_arg(p, "the admin's")
    p.add_argument(
        "--run-dir",
        help="run directory of a `streamrl up` (for its broker URL"
        + (" and rollout.partitions)" if partitioned else ")"),
    )
    if not partitioned:
        return
    p.add_argument(
        "--partitions",
        type=int,
        help="the job's rollout.partitions (default: from --run-dir's config, else 1): the user is granted "
        "every partition's keys",
    )


def run_keys(args, url: str) -> Keys:
    """The keys of the run the user is for: its partitions (--partitions, else the run dir's config) and
    the cluster layout when `url` is a cluster's."""
    partitions = getattr(args, "partitions", None)
    if partitions is None:
        cfg = run_dir_config(args.run_dir) if getattr(args, "run_dir", None) else None
        partitions = cfg.rollout.partitions if cfg is not None else 1
    return Keys(args.run, partitions, is_cluster_url(url))


def admin_url(args, who: str, example: str) -> str:
    """The admin URL of `args`, once NAME is checked (add and remove need one; `who` and `example` name
    the kind of user in the error)."""
    from streamrl.commands.common import broker_url

    if args.action != "list" and not (args.name and re.fullmatch(r"[A-Za-z0-9_-]+", args.name)):
        raise ConfigError(f"give {who} a NAME of letters, digits, '_' or '-', e.g. `{example}`")
    return broker_url(args)


def user_url(admin_url: str, user: str, password: str) -> str:
    """The admin URL with the restricted user's credentials in place of the admin's."""
    parts = urlsplit(admin_url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"))


async def set_user(
    admin_url: str,
    user: str,
    rules: Callable[[str, int], list[str]],
    streams: list[str],
    group: str,
    check: Callable[[Any], Awaitable[None]] | None = None,
) -> str:
    """Create (or reset) `user` with `rules(password, server_major)` on every node, persisted, and ensure its
    group on each of `streams`; return the user's URL (a fresh password each time). `check(broker)` runs
    first (and may refuse). Notes on nodes where the user is not persisted go to stderr."""
    from brokers.acl import acl_nodes, close_nodes, on_every_node
    from brokers.connect import connect

    broker = await connect(admin_url, retries=3)
    nodes = []
    try:
        if check is not None:
            await check(broker)
        for stream in streams:
            await broker.ensure_group(stream, group)
        major = int((await broker.client.info("server"))["redis_version"].split(".")[0])
        password = secrets.token_urlsafe(24)
        nodes = await acl_nodes(broker, admin_url)
        _, notes = await on_every_node(nodes, "ACL", "SETUSER", user, *rules(password, major))
        _warn(notes)
        return user_url(admin_url, user, password)
    finally:
        await close_nodes(nodes)
        await broker.close()


def _warn(notes: list[str]) -> None:
    for note in notes:
        print(f"warning: {note}", file=sys.stderr)


async def delete_user(admin_url: str, user: str, drop_group: tuple[list[str], str] | None = None) -> int:
    """ACL DELUSER on every node (persisted); with `drop_group` (streams, group) also destroy that consumer
    group on each stream. The count removed (the most any node removed)."""
    from brokers.acl import acl_nodes, close_nodes, on_every_node
    from brokers.connect import connect

    broker = await connect(admin_url, retries=3)
    nodes = []
    try:
        nodes = await acl_nodes(broker, admin_url)
        removed, notes = await on_every_node(nodes, "ACL", "DELUSER", user)
        _warn(notes)
        if drop_group:
            for stream in drop_group[0]:
                await broker.client.xgroup_destroy(stream, drop_group[1])
        return max(int(n) for n in removed)
    finally:
        await close_nodes(nodes)
        await broker.close()


async def users_starting(admin_url: str, prefix: str) -> list[str]:
    """The users whose name starts with `prefix`; one missing on some node is listed with those nodes."""
    from brokers.acl import acl_nodes, close_nodes
    from brokers.connect import connect

    broker = await connect(admin_url, retries=3)
    nodes = []
    try:
        nodes = await acl_nodes(broker, admin_url)
        per_node = {}
        for node in nodes:
            users = await node.client.execute_command("ACL", "USERS")
            per_node[node.name] = {x.decode() if isinstance(x, bytes) else x for x in users}
        every = sorted({u for users in per_node.values() for u in users if u.startswith(prefix)})
        out = []
        for u in every:
            missing = [n for n, users in per_node.items() if u not in users]
            out.append(u + (f"  (missing on {', '.join(missing)}: run `add` again)" if missing else ""))
        return out
    finally:
        await close_nodes(nodes)
        await broker.close()
