"""What `streamrl producer` and `streamrl envuser` share: a run's restricted broker users (Redis ACL),
created with their consumer group, listed and removed through the admin URL, and the arguments that say which."""

from __future__ import annotations

import re
import secrets
from typing import Callable
from urllib.parse import quote, urlsplit, urlunsplit

from streamrl.core.errors import ConfigError


def add_arguments(p, name_help: str) -> None:
    """The action, the user's NAME and where the run's broker is: the same for every kind of user."""
    p.add_argument("action", choices=["add", "remove", "list"])
    p.add_argument("name", nargs="?", help=name_help)
    p.add_argument("--run", required=True, help="run name (run.name of the job)")
    p.add_argument("--broker", help="admin redis:// URL (default: $STREAMRL_BROKER_URL or RUN_DIR/broker/url)")
    p.add_argument("--run-dir", help="run directory of a local `streamrl up` (for its broker URL)")


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


async def set_user(admin_url: str, user: str, rules: Callable[[str, int], list[str]], stream: str, group: str) -> str:
    """Create (or reset) `user` with `rules(password, server_major)` and ensure its group on `stream`;
    return the user's URL (a fresh password each time)."""
    from brokers.redis_streams import connect

    broker = await connect(admin_url, retries=3)
    try:
        await broker.ensure_group(stream, group)
        major = int((await broker.client.info("server"))["redis_version"].split(".")[0])
        password = secrets.token_urlsafe(24)
        await broker.client.execute_command("ACL", "SETUSER", user, *rules(password, major))
        return user_url(admin_url, user, password)
    finally:
        await broker.close()


async def delete_user(admin_url: str, user: str, drop_group: tuple[str, str] | None = None) -> int:
    """ACL DELUSER; with `drop_group` (stream, group) also destroy that consumer group. The count removed."""
    from brokers.redis_streams import connect

    broker = await connect(admin_url, retries=3)
    try:
        n = int(await broker.client.execute_command("ACL", "DELUSER", user))
        if drop_group:
            await broker.client.xgroup_destroy(*drop_group)
        return n
    finally:
        await broker.close()


async def users_starting(admin_url: str, prefix: str) -> list[str]:
    from brokers.redis_streams import connect

    broker = await connect(admin_url, retries=3)
    try:
        users = await broker.client.execute_command("ACL", "USERS")
        return [u for u in (x.decode() if isinstance(x, bytes) else x for x in users) if u.startswith(prefix)]
    finally:
        await broker.close()
