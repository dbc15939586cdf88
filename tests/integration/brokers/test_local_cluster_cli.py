"""`python -m brokers.local_cluster`: the documented command that starts a local Redis Cluster by hand
(docs/scaling-brokers.md): its URL in DIR/url (mode 0600), every slot served, Ctrl-C stops every node.

    pytest tests/integration/brokers/test_local_cluster_cli.py
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from streamrl.core.broker_url import sync_client


@pytest.mark.timeout(120)
def test_the_documented_command_starts_a_cluster_and_ctrl_c_stops_it(tmp_path):
    folder = tmp_path / "cluster"
    proc = subprocess.Popen(
        [sys.executable, "-m", "brokers.local_cluster", "--dir", str(folder), "--node-timeout-ms", "2000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while not (folder / "url").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.1)
        url = (folder / "url").read_text().strip()
        assert (folder / "url").stat().st_mode & 0o077 == 0 and url.startswith("redis+cluster://:")
        with sync_client(url) as r:
            assert r.cluster_info()["cluster_state"] == "ok" and len(r.get_primaries()) == 3
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        out = proc.stdout.read()
        assert "cluster up: redis+cluster://" in out and url.split("@")[0].split(":")[-1] not in out, out
        logs = sorted(folder.glob("node-*/redis.log"))
        assert len(logs) == 6 and all("ready to exit" in p.read_text() for p in logs)
    finally:
        if proc.poll() is None:
            proc.kill()
