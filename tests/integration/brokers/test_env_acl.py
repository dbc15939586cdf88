"""What the broker user of `streamrl envuser add` may and may not do (Redis 6.2 and >= 7, the servers
test_producer_acl.py finds), and a real env worker answering steps under it.

    pytest tests/integration/brokers/test_env_acl.py
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from redis.exceptions import NoPermissionError

from brokers.connect import connect
from streamrl.config.schema import BrokerConfig, Config, EnvConfig, RunConfig
from streamrl.core.broker import Keys
from streamrl.core.messages import decode, encode
from tests.integration.brokers.test_producer_acl import acl_server, admin  # noqa: F401 (fixtures)
from tests.integration.envs.test_env_worker import burst, request
from workers.env import EnvWorker

pytestmark = pytest.mark.anyio


def envuser_add(url: str, run: str, name: str) -> str:
    cmd = [sys.executable, "-m", "streamrl.cli", "envuser", "add", name, "--run", run, "--broker", url]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()[0]


async def test_the_env_user_stays_inside_its_grant_and_serves_steps(acl_server, admin, run_name):  # noqa: F811
    major, server = acl_server
    keys, other = Keys(run_name), Keys(run_name + "-other")
    await admin.set(keys.weights_latest, "secret")
    await admin.add(keys.prompts, b"p")
    url = envuser_add(server.url, run_name, "node")
    assert url.startswith(f"redis://env-{run_name}-node:")
    eb = await connect(url, retries=0)
    c = eb.client
    try:
        # A real env worker under the user: reads the step through group `env`, answers, acks.
        await admin.add(keys.env_steps, encode(request(["x"])))
        cfg = Config(
            run=RunConfig(name=run_name),
            broker=BrokerConfig(url=url, claim_idle_ms=200, block_ms=50),
            env=EnvConfig(fn="tests.programs.env_fns:Counter"),
        )
        w = EnvWorker(cfg, eb, "node-0")
        await w.start()
        await burst(w)
        obs = [decode(e.data) for e in await admin.read(keys.observations("gen-0"))]
        assert [(o.text, o.error) for o in obs] == [("1:x", "")]
        assert (await admin.group_info(keys.env_steps))[0]["pending"] == 0
        await eb.add(keys.deadletter, b"{}")
        denied = [
            c.get(keys.weights_latest),
            c.xadd(keys.prompts, {"d": b"x"}),
            c.xadd(keys.rollouts, {"d": b"x"}),
            c.xadd(keys.annotations, {"d": b"x"}),
            c.xrange(keys.prompts),
            c.xreadgroup("env", "e", {keys.rollouts: ">"}),
            c.xreadgroup("env", "e", {other.env_steps: ">"}),
            c.xadd(other.observations("gen-0"), {"d": b"x"}),
            c.delete(keys.env_steps),
            c.xtrim(keys.env_steps, 0),
            c.xgroup_destroy(keys.env_steps, "env"),
            c.incr(keys.trainer_version),
            c.set(keys.worker("env", "someone-else"), "{}"),
            c.execute_command("ACL", "LIST"),
            c.flushall(),
        ]
        if major >= 7:  # selectors: XADD only to observations / dead letters, GET only heartbeats
            denied += [
                c.xadd(keys.env_steps, {"d": b"x"}),
                c.xrange(keys.observations("gen-0")),
                c.set(keys.worker("env", "env-x"), "{}"),
                c.xadd(keys.worker("env", "env-x"), {"d": b"x"}),
                c.get(keys.env_steps),
            ]
        for call in denied:
            with pytest.raises(NoPermissionError):
                await call
        if major >= 7:
            await c.set(keys.worker("env", "node-0"), "{}", px=15_000)  # its own heartbeat only
        else:
            with pytest.raises(NoPermissionError):
                await c.set(keys.worker("env", "node-0"), "{}")
    finally:
        await eb.close()
