"""The `mooncake` backend's fan-out on real processes: readers that start together do not all read the
trainer; each holder of a version serves one reader at a time, and every finished read is one more
holder (streamrl/weights/mooncake.py, MooncakeLoader._claim_source).

    pytest tests/integration/weights/test_mooncake_fanout.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from streamrl.config.schema import Config
from streamrl.weights.shm import shm_root
from streamrl.weights.store import make_publisher
from tests.integration.weights.mooncake_procs import cfg_of, next_row, uniform_state

pytest.importorskip("mooncake.engine", reason="the mooncake extra (make setup installs it)")
pytestmark = pytest.mark.anyio

READERS = 3
READER = r"""
import asyncio, json, sys
from pathlib import Path
from brokers.connect import connect
from streamrl.weights.mooncake import wait_fetched
from streamrl.weights.store import make_loader
from tests.integration.weights.mooncake_procs import cfg_of, check

async def main(url, run, run_dir):
    broker = await connect(url, retries=3)
    loader = make_loader(cfg_of(url, run), broker, Path(run_dir))
    print(json.dumps({"up": True}), flush=True)
    handle, path = await wait_fetched(loader, 1, timeout_s=300)
    print(json.dumps({"version": handle.version, "source": loader.last_source, **check(path)}), flush=True)
    await asyncio.sleep(300)  # a holder: it serves the version to the others until killed

asyncio.run(main(*sys.argv[1:]))
"""


async def test_readers_started_together_read_from_each_other(config: Config, broker, tmp_path: Path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    argv = [sys.executable, "-c", READER, config.broker.url, config.run.name, str(tmp_path)]
    readers = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        for _ in range(READERS)
    ]
    pub = make_publisher(cfg_of(config.broker.url, config.run.name), broker, None)
    try:
        for r in readers:
            next_row(r, "up")  # all polling the broker: the version reaches them together
        await pub.publish(1, uniform_state(1, 32))
        rows = [next_row(r, "uniform") for r in readers]
        assert all(r["version"] == 1 and r["uniform"] and r["value"] == 1.0 for r in rows), rows
        sources = [r["source"] for r in rows]
        # Without the claims all three read the trainer at once; with them one does first, then at most
        # one more reads it while another reads from the first (a peer).
        assert 1 <= sources.count("trainer") <= READERS - 1, sources
        peers = await broker.hgetall(pub.keys.weights_latest + ":peers")
        holders = {k.decode() if isinstance(k, bytes) else k for k, v in peers.items() if v}
        assert len(holders) == READERS and {s for s in sources if s != "trainer"} <= holders, (sources, holders)
    finally:
        for r in readers:
            r.kill()
            r.wait()
        await pub.close()
        shutil.rmtree(shm_root(config.run.name, tmp_path), ignore_errors=True)
