"""What `streamrl producer` and `streamrl envuser` share: a run's restricted broker users (Redis ACL),
created with their consumer group, listed and removed through the admin URL."""

from __future__ import annotations

import secrets
from typing import Callable
from urllib.parse import quote, urlsplit, urlunsplit


def user_url(admin_url: str, user: str, password: str) -> str:
    """The admin URL with the restricted user's credentials in place of the admin's."""
    parts = urlsplit(admin_url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"))


async def set_user(admin_url: str, user: str, rules: Callable[[str, int], list[str]], stream: str, group: str) -> str:
    """Create (or reset) `user` with `rules(password, server_major)` and ensure its group on `stream`;
    return the user's URL (a fresh password each time)."""
    from brokers.connect import connect

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
    from brokers.connect import connect

    broker = await connect(admin_url, retries=3)
    try:
        n = int(await broker.client.execute_command("ACL", "DELUSER", user))
        if drop_group:
            await broker.client.xgroup_destroy(*drop_group)
        return n
    finally:
        await broker.close()


async def users_starting(admin_url: str, prefix: str) -> list[str]:
    from brokers.connect import connect

    broker = await connect(admin_url, retries=3)
    try:
        users = await broker.client.execute_command("ACL", "USERS")
        return [u for u in (x.decode() if isinstance(x, bytes) else x for x in users) if u.startswith(prefix)]
    finally:
        await broker.close()
