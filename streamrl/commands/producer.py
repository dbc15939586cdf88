"""`streamrl producer add|remove|list`: broker users (Redis ACL) for external reward producers.

    streamrl producer add judge --key judge --run tiny --run-dir runs/demo     # prints the producer's URL
    streamrl producer remove judge --run tiny --broker redis://:ADMIN@host:6379/0

`add` creates the consumer group NAME on `rollouts` (as the admin) and a user that may only run
the stream commands a producer needs (ACL_COMMANDS) on its run's `rollouts`, `annotations` and
`deadletter` keys, and GET the run's end mark (`run:end`, streamrl/core/run_end.py). What Redis can and
cannot restrict is spelled out in docs/protocol.md ("Access control"): on Redis 6.2 commands and
key patterns are granted independently; on Redis >= 7 selectors pair XADD with
`annotations`/`deadletter` only, GET with `run:end` only and SET/DEL with the heartbeat keys.
"""

from __future__ import annotations

import asyncio
import re

from streamrl.commands.acl_users import delete_user, set_user, users_starting
from streamrl.core.broker import Keys
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
    """ACL SETUSER arguments for producer `name` (after the user name)."""
    read = [f"~{s}" for s in keys.rollout_streams]
    write = [*(f"~{s}" for s in keys.annotation_streams), f"~{keys.deadletter}"]
    heartbeat = "~" + keys.worker("producer", f"{name}-*")
    base = ["reset", "on", f">{password}", "-@all", *(f"+{c}" for c in ACL_COMMANDS)]
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


async def add(admin_url: str, run: str, name: str) -> str:
    """Create (or reset) the producer's user and group; return its URL."""
    keys = Keys(run)
    return await set_user(
        admin_url, user_name(run, name), lambda pw, major: acl_rules(keys, name, pw, major), keys.rollouts, name
    )


def add_arguments(p) -> None:
    p.add_argument("action", choices=["add", "remove", "list"])
    p.add_argument("name", nargs="?", help="producer name: its consumer group on `rollouts` and its user")
    p.add_argument(
        "--key",
        help="annotation key it will write (shown in the printed commands; the broker cannot check message contents)",
    )
    p.add_argument("--run", required=True, help="run name (run.name of the job)")
    p.add_argument("--broker", help="admin redis:// URL (default: $STREAMRL_BROKER_URL or RUN_DIR/broker/url)")
    p.add_argument("--run-dir", help="run directory of a local `streamrl up` (for its broker URL)")
    p.add_argument("--drop-group", action="store_true", help="remove: also destroy the consumer group")


def run(args) -> int:
    from streamrl.commands.common import broker_url

    if args.action != "list" and not (args.name and re.fullmatch(r"[A-Za-z0-9_-]+", args.name)):
        raise ConfigError("give the producer a NAME of letters, digits, '_' or '-', e.g. `streamrl producer add judge`")
    url = broker_url(args)
    if args.action == "add":
        purl = asyncio.run(add(url, args.run, args.name))
        key = args.key or args.name
        print(purl)
        print(
            f"# user {user_name(args.run, args.name)}: XREADGROUP/XACK `rollouts` as group '{args.name}', "
            f"XADD to `annotations`; add `{{key: {key}, weight: 1.0, timeout_s: 30}}` to annotations.external"
        )
        print(
            f"# streamrl reward --fn MODULE:FUNCTION --key {key} --name {args.name} --run {args.run} --broker '{purl}'"
        )
    elif args.action == "remove":
        drop = (Keys(args.run).rollouts, args.name) if args.drop_group else None
        n = asyncio.run(delete_user(url, user_name(args.run, args.name), drop))
        print(f"removed {n} user(s)")
    else:
        print("\n".join(asyncio.run(users_starting(url, user_name(args.run, "")))))
    return 0
