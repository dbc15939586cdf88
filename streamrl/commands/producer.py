"""`streamrl producer add|remove|list`: broker users (Redis ACL) for external reward producers.

    streamrl producer add judge --key judge --run tiny --run-dir runs/demo     # prints the producer's URL
    streamrl producer add judge --key judge --run tiny --partitions 3 --broker redis+cluster://:ADMIN@h1:7000,h2:7000
    streamrl producer remove judge --run tiny --broker redis://:ADMIN@host:6379/0

`add` creates the consumer group NAME on every partition of `rollouts` (as the admin) and a user, on
every node of a cluster (brokers/acl.py, saved there for restarts), that may only run
the stream commands a producer needs (ACL_COMMANDS) on its run's `rollouts`, `annotations` and
`deadletter` keys, and GET the run's end mark (`run:end`, streamrl/core/run_end.py). What Redis can and
cannot restrict is spelled out in docs/protocol.md ("Access control"): on Redis 6.2 commands and
key patterns are granted independently; on Redis >= 7 selectors pair XADD with
`annotations`/`deadletter` only, GET with `run:end` only and SET/DEL with the heartbeat keys.
"""

from __future__ import annotations

import asyncio

from streamrl.commands import acl_users
from streamrl.commands.acl_users import cluster_grant, delete_user, set_user, users_starting
from streamrl.core.broker import Keys, found_partitions
from streamrl.core.errors import ConfigError
from streamrl.core.run_end import user_name

NAME = "producer"
HELP = "create or remove a restricted broker user for an external reward producer"
DESCRIPTION = (
    "Manage Redis ACL users for external producers: each may read `rollouts` (through its own consumer "
    "group) and append to `annotations`/`deadletter` of one run, nothing else."
)
ACL_COMMANDS = [
    "ping",
    "xreadgroup",
    "xack",
    "xautoclaim",
    "xclaim",
    "xpending",
    "xrange",
    "xinfo|groups",
    "xgroup|create",
]
"""Reading through a consumer group, taking over a dead replica's entries, creating the own group."""
WRITE_COMMANDS = ["xadd"]
END_COMMANDS = ["get"]
"""Reading the run's end mark (a string key: XADD cannot overwrite it)."""
HEARTBEAT_COMMANDS = ["set", "del"]


def acl_rules(keys: Keys, name: str, password: str, server_major: int) -> list[str]:
    """ACL SETUSER arguments for producer `name` (after the user name): the keys of `keys` (every partition,
    the cluster layout), plus what a cluster client needs (brokers.acl.CLUSTER_COMMANDS) on a cluster."""
    read = [f"~{s}" for s in keys.rollout_streams]
    write = [*(f"~{s}" for s in keys.annotation_streams), f"~{keys.deadletter}"]
    heartbeat = "~" + keys.worker("producer", f"{name}-*")
    base = ["reset", "on", f">{password}", "-@all", *(f"+{c}" for c in ACL_COMMANDS), *cluster_grant(keys)]
    if server_major >= 7:
        # Selectors pair commands with keys: XADD only to annotations/deadletter, GET only the end
        # mark, SET/DEL only the heartbeat.
        return [
            *base,
            *read,
            f"({' '.join(write + ['+' + c for c in WRITE_COMMANDS])})",
            f"(%R~{keys.run_end} {' '.join('+' + c for c in END_COMMANDS)})",
            f"({heartbeat} {' '.join('+' + c for c in HEARTBEAT_COMMANDS)})",
        ]
    # Redis 6.2: one command set x one key set. XADD must be granted, so it also works on `rollouts`;
    # GET works on the granted streams too, where it only answers WRONGTYPE. SET/DEL are not granted
    # (they would work on every granted key): no heartbeats for this user.
    return [*base, *(f"+{c}" for c in WRITE_COMMANDS + END_COMMANDS), *read, *write, f"~{keys.run_end}"]


async def add(admin_url: str, keys: Keys, name: str) -> str:
    """Create (or reset) the producer's user on every node and its group on every partition; return its URL."""
    return await set_user(
        admin_url,
        user_name(keys.run, name),
        lambda pw, major: acl_rules(keys, name, pw, major),
        keys.rollout_streams,
        name,
        check=lambda broker: check_partitions(broker, keys),
    )


async def check_partitions(broker, keys: Keys) -> None:
    """Refuse a user (and groups, which would create streams) for a layout the run does not use: a job
    already running with another rollout.partitions has its `rollouts` under other names."""
    found = await found_partitions(broker, keys.run)
    if found and not set(keys.rollout_streams) & set(found):
        raise ConfigError(
            f"run {keys.run!r} has its rollouts in {found} ({len(found)} partition(s)), not in "
            f"{keys.rollout_streams}: pass --partitions {len(found)} (the job's rollout.partitions), or --run-dir "
            "of its `streamrl up`"
        )


def add_arguments(p) -> None:
    acl_users.add_arguments(p, "producer name: its consumer group on `rollouts` and its user")
    p.add_argument(
        "--key",
        help="annotation key it will write (shown in the printed commands; the broker cannot check message contents)",
    )
    p.add_argument("--drop-group", action="store_true", help="remove: also destroy the consumer group")


def run(args) -> int:
    url = acl_users.admin_url(args, "the producer", "streamrl producer add judge")
    if args.action == "add":
        keys = acl_users.run_keys(args, url)
        purl = asyncio.run(add(url, keys, args.name))
        key = args.key or args.name
        print(purl)
        print(
            f"# user {user_name(args.run, args.name)}: XREADGROUP/XACK `rollouts` as group '{args.name}', "
            f"XADD to `annotations`; add `{{key: {key}, weight: 1.0, timeout_s: 30}}` to annotations.external"
        )
        parts = f" --partitions {keys.partitions}" if keys.partitions > 1 else ""
        print(
            f"# streamrl reward --fn MODULE:FUNCTION --key {key} --name {args.name} --run {args.run}{parts} "
            f"--broker '{purl}'"
        )
    elif args.action == "remove":
        drop = (acl_users.run_keys(args, url).rollout_streams, args.name) if args.drop_group else None
        n = asyncio.run(delete_user(url, user_name(args.run, args.name), drop))
        print(f"removed {n} user(s)")
    else:
        print("\n".join(asyncio.run(users_starting(url, user_name(args.run, "")))))
    return 0
