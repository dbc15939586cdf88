"""The embedded broker's unix socket: the same round trip as TCP, a TCP fallback, clear URL errors.

pytest tests/integration/brokers/test_unix_socket.py
"""

from __future__ import annotations

import stat
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from structlog.testing import capture_logs

from brokers.connect import connect
from brokers.embedded import EmbeddedRedis
from brokers.urls import UNIX_PATH_MAX, unix_url
from streamrl.core.errors import BrokerError

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    s = EmbeddedRedis(tmp_path_factory.mktemp("sock") / "broker").start()
    yield s
    s.stop()


def test_the_server_listens_on_an_owner_only_socket_and_publishes_tcp(server):
    assert server.local_url.startswith(f"unix://:{server.password}@/")
    assert unquote(urlsplit(server.local_url).path) == str(server.data_dir / "redis.sock")
    assert stat.S_IMODE(server.socket_path.stat().st_mode) == 0o700
    # Other hosts (and `streamrl worker --run-dir`) read the TCP URL.
    assert (server.data_dir / "url").read_text().strip() == server.url
    assert server.url.startswith("redis://")


@pytest.mark.anyio
@pytest.mark.parametrize("which", ["url", "local_url"])
async def test_a_broker_round_trips_over_tcp_and_the_unix_socket(server, which):
    broker = await connect(getattr(server, which), retries=3)
    try:
        info = await broker.client.client_info()
        # CLIENT INFO's laddr: the socket path for a unix connection, 127.0.0.1:port for TCP.
        expected = str(server.socket_path) if which == "local_url" else f"127.0.0.1:{server.port}"
        assert info["laddr"].startswith(expected)
        stream, group = f"roundtrip-{which}", "g"
        await broker.ensure_group(stream, group)
        ids = await broker.add_many(stream, [b"a", b"b", b"c"])
        got = await broker.read_group(stream, group, "c1", count=10)
        assert [e.data for e in got] == [b"a", b"b", b"c"] and [e.id for e in got] == ids
        await broker.add_and_ack(f"{stream}-out", [b"x"], stream, group, [ids[0]])
        await broker.ack(stream, group, ids[1:])
        assert [g["pending"] for g in await broker.group_info(stream)] == [0]
        assert [e.data for e in await broker.read(f"{stream}-out", "0", count=10)] == [b"x"]
    finally:
        await broker.close()


def test_a_restart_on_the_same_dir_keeps_the_socket_url(tmp_path: Path):
    with EmbeddedRedis(tmp_path / "broker") as first:
        url = first.local_url
    with EmbeddedRedis(tmp_path / "broker") as second:  # what the supervisor's broker watch does
        assert second.local_url == url and url.startswith("unix://")


@pytest.mark.anyio
async def test_a_data_dir_too_long_for_a_socket_falls_back_to_tcp(tmp_path: Path):
    data_dir = tmp_path / ("d" * UNIX_PATH_MAX) / "broker"
    with capture_logs() as logs:
        s = EmbeddedRedis(data_dir)
    assert s.socket_path is None
    assert [e for e in logs if e["event"] == "embedded_redis_tcp_only"], logs
    with s:
        assert s.local_url == s.url and s.url.startswith("redis://")
        assert "unixsocket" not in (s.data_dir / "redis.conf").read_text()
        broker = await connect(s.local_url, retries=3)
        assert await broker.client.ping()
        await broker.close()


def test_the_socket_can_be_turned_off(tmp_path: Path):
    with EmbeddedRedis(tmp_path / "broker", unix_socket=False) as s:
        assert s.socket_path is None and s.local_url == s.url
        assert not (s.data_dir / "redis.sock").exists()


@pytest.mark.anyio
@pytest.mark.parametrize(
    "url, why",
    [
        ("unix://", "names no socket path"),
        ("unix://:s3cret@", "names no socket path"),
        ("unix://:s3cret@localhost/tmp/redis.sock?db=0", "names a host"),
        ("unix://:s3cret@/tmp/redis.sock?db=zero", "malformed"),
    ],
)
async def test_a_malformed_unix_url_is_a_clear_broker_error(url, why):
    with pytest.raises(BrokerError, match=why) as err:
        await connect(url, retries=0)
    assert "s3cret" not in str(err.value)  # redacted, as every broker error
    assert "unix://:PASSWORD@/path/to/redis.sock?db=0" in str(err.value)


@pytest.mark.anyio
async def test_a_socket_path_too_long_is_refused_before_connecting():
    with pytest.raises(BrokerError, match="112 bytes, longer than the 107") as err:
        await connect(unix_url("/tmp/" + "x" * UNIX_PATH_MAX, "s3cret"), retries=0)
    assert "s3cret" not in str(err.value)


@pytest.mark.anyio
async def test_a_missing_socket_is_unreachable_not_a_crash(tmp_path: Path):
    with pytest.raises(BrokerError, match="cannot reach the broker"):
        await connect(unix_url(tmp_path / "none.sock", "s3cret"), retries=1, backoff_base_s=0.01)
