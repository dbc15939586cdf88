"""The console of `streamrl up` for env.fn=external (streamrl/launch/env_watch.py) against a real
redis-server: it keeps warning while no env worker has a heartbeat, says when one joins, and warns
again when every one has left.

    pytest tests/integration/launch/test_env_watch.py
"""

from __future__ import annotations

import json

import pytest

from streamrl.config.schema import Config, EnvConfig, RunConfig
from streamrl.launch.env_watch import EnvWatch, NoEnvWatch
from streamrl.launch.supervisor import Supervisor

pytestmark = pytest.mark.anyio


async def test_warns_while_no_env_worker_has_joined(broker, redis_server, run_name):
    watch = EnvWatch(redis_server.url, run_name, every_s=10, check_s=1)
    keys = watch.keys
    try:
        t = 1000.0
        watch._said_at = t  # `up` said it at start
        assert watch.poll(t + 1) is None  # said a second ago
        line = watch.poll(t + 11)
        assert line.startswith("warning: no env worker has joined yet (env.fn=external)") and run_name in line
        assert watch.poll(t + 12) is None and watch.poll(t + 20) is None  # once per every_s
        await broker.ensure_group(keys.env_steps, "env")  # the generators' first steps
        await broker.add(keys.env_steps, b"step")
        await broker.add(keys.env_steps, b"step")
        assert "2 env step(s) waiting" in watch.poll(t + 22)  # the warning repeats while none joins
        await broker.set(keys.worker("env", "env-node-1"), json.dumps({"ts": t, "sticky": 1}), ttl_s=15)
        assert watch.poll(t + 24) == "env worker(s) joined: env-node-1"
        assert watch.poll(t + 40) is None  # quiet while it is there
        await broker.client.delete(keys.worker("env", "env-node-1"))
        assert "no env worker has joined yet" in watch.poll(t + 42)  # it left: at once, not every_s later
    finally:
        watch.close()


def test_up_watches_only_jobs_whose_env_workers_are_external(tmp_path):
    def watch(fn: str | None):
        cfg = Config(run=RunConfig(name="x"), env=EnvConfig(fn=fn))
        return Supervisor(cfg, tmp_path, "redis://127.0.0.1:1/0").env_watch

    assert isinstance(watch("external"), EnvWatch)
    assert isinstance(watch("charclass_dialog"), NoEnvWatch) and isinstance(watch(None), NoEnvWatch)
