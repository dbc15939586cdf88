"""`streamrl envuser add|remove|list`: broker users (Redis ACL) for external env workers.

    streamrl envuser add node --run tiny --run-dir runs/demo        # prints the env worker's URL
    STREAMRL_BROKER_URL=<that URL> node examples/node/env.mjs --run tiny --id node-0

The user may only run the stream commands an env worker needs (producer.ACL_COMMANDS) on its run's
`env_steps` and `env_steps:*` (read through the consumer group "env"; SCAN and GET on the env
heartbeats to take over a dead worker's own stream), append observations to `observations:*` and
dead letters to `deadletter`, and keep its heartbeat `workers:env:NAME-*` (so its worker ids must
start with `NAME-`). As for producers (docs/protocol.md, "Access control"): Redis >= 7 selectors
pair XADD with the observation and dead-letter keys only and SET/DEL with the heartbeat keys; on
Redis 6.2 commands and keys are granted independently (XADD also works on `env_steps`) and SET/DEL
are not granted (no heartbeat).
"""

from __future__ import annotations

import asyncio

from streamrl.commands import acl_users
from streamrl.commands.acl_users import cluster_grant, delete_user, set_user, users_starting
from streamrl.commands.producer import ACL_COMMANDS, HEARTBEAT_COMMANDS, WRITE_COMMANDS
from streamrl.core.broker import Keys
from streamrl.core.broker_url import is_cluster_url

NAME = "envuser"
HELP = "create or remove a restricted broker user for an external env worker"
DESCRIPTION = (
    "Manage Redis ACL users for external env workers: each may read `env_steps` (group `env`) and "
    "append to `observations:*`/`deadletter` of one run, nothing else."
)
GROUP = "env"


def user_name(run: str, name: str) -> str:
    return f"env-{run}-{name}"


def acl_rules(keys: Keys, name: str, password: str, server_major: int) -> list[str]:
    """ACL SETUSER arguments for env user `name` (after the user name)."""
    # env_steps:* are the workers' own step streams (sticky routing); the worker SCANs for those of
    # dead workers and GETs their heartbeats to take them over (SCAN lists key names, no values).
    read = [f"~{keys.env_steps}", f"~{keys.env_steps_of('*')}"]
    write = [f"~{keys.observations('*')}", f"~{keys.deadletter}"]
    heartbeats = keys.worker("env", "*")
    heartbeat = "~" + keys.worker("env", f"{name}-*")
    base = ["reset", "on", f">{password}", "-@all", *(f"+{c}" for c in ACL_COMMANDS), "+scan", *cluster_grant(keys)]
    if server_major >= 7:
        return [
            *base,
            *read,
            f"({' '.join(write + ['+' + c for c in WRITE_COMMANDS])})",
            f"({heartbeat} {' '.join('+' + c for c in HEARTBEAT_COMMANDS)})",
            f"(%R~{heartbeats} +get)",
        ]
    return [*base, *(f"+{c}" for c in WRITE_COMMANDS), "+get", *read, *write, f"~{heartbeats}"]


async def add(admin_url: str, run: str, name: str) -> str:
    """Create (or reset) the env user on every node and the `env` group; return its URL."""
    keys = Keys(run, cluster=is_cluster_url(admin_url))
    return await set_user(
        admin_url, user_name(run, name), lambda pw, major: acl_rules(keys, name, pw, major), [keys.env_steps], GROUP
    )


def add_arguments(p) -> None:
    acl_users.add_arguments(p, "env user name; its workers' ids start with NAME-", partitioned=False)


def run(args) -> int:
    url = acl_users.admin_url(args, "the env user", "streamrl envuser add node")
    if args.action == "add":
        eurl = asyncio.run(add(url, args.run, args.name))
        print(eurl)
        print(
            f"# user {user_name(args.run, args.name)}: XREADGROUP/XACK `env_steps` as group 'env', XADD to "
            f"`observations:*`; worker ids must start with '{args.name}-' (heartbeats)"
        )
        print(f"# streamrl env --fn MODULE:Class --run {args.run} --id {args.name}-0 --broker '{eurl}'")
    elif args.action == "remove":
        n = asyncio.run(delete_user(url, user_name(args.run, args.name)))
        print(f"removed {n} user(s)")
    else:
        print("\n".join(asyncio.run(users_starting(url, user_name(args.run, "")))))
    return 0
