"""Broker URLs: build and check `unix://` URLs, and the client options each transport takes.

The embedded server also listens on a unix socket in its data dir; roles on its host connect
through it (no loopback TCP stack per command), other hosts through its TCP URL.

    unix_url("/run/x/broker/redis.sock", "PW")   # unix://:PW@/run/x/broker/redis.sock?db=0
    options = client_options(url, redact(url), {"socket_keepalive": True, ...})
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from streamrl.core.errors import BrokerError

UNIX_PATH_MAX = 107
"""Longest unix socket path in bytes: sockaddr_un.sun_path is 108 bytes on Linux, NUL included."""
TCP_ONLY = ("socket_keepalive", "socket_keepalive_options", "socket_type")
"""redis-py options its UnixDomainSocketConnection refuses (TypeError at the first command)."""
UNIX_FORM = "unix://:PASSWORD@/path/to/redis.sock?db=0"


def unix_path_fits(path: str | os.PathLike) -> bool:
    return len(os.fsencode(path)) <= UNIX_PATH_MAX


def unix_url(path: str | os.PathLike, password: str, db: int = 0) -> str:
    """The URL of a unix socket with a password (`path` absolute)."""
    return f"unix://:{quote(password, safe='')}@{quote(os.fspath(path))}?db={db}"


def client_options(url: str, shown: str, options: dict[str, Any]) -> dict[str, Any]:
    """`options` fit for the transport of `url`; a unix:// URL that cannot work raises BrokerError.

    `shown` is the URL with its password redacted, for the error text.
    """
    parts = urlsplit(url)
    if parts.scheme != "unix":
        return options
    path = unquote(parts.path)
    if parts.hostname:
        raise BrokerError(
            f"broker URL {shown} names a host ({parts.hostname}); a unix socket URL has none: {UNIX_FORM}"
        )
    if not path:
        raise BrokerError(f"broker URL {shown} names no socket path; use {UNIX_FORM}")
    if not unix_path_fits(path):
        raise BrokerError(
            f"broker URL {shown}: the socket path is {len(os.fsencode(path))} bytes, longer than the "
            f"{UNIX_PATH_MAX} a unix socket allows; use a shorter path or the server's redis:// URL"
        )
    return {k: v for k, v in options.items() if k not in TCP_ONLY}
