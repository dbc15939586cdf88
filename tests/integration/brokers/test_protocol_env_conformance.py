"""docs/protocol.md, "Environment steps", statement by statement (the rest of the doc:
test_protocol_conformance.py): step requests and observations built by hand as msgpack, raw Redis
commands, the env worker's side played by examples/node/env.mjs (written from the doc alone) and by
the Python worker (the reference), the generator's side by the real EpisodeRunner; the restricted env
user of `streamrl envuser add` on Redis >= 7.

    pytest tests/integration/brokers/test_protocol_env_conformance.py
"""

from __future__ import annotations

import asyncio
import json
import os

import msgpack
import pytest
import redis.asyncio as aioredis

from tests.integration.brokers.test_protocol_conformance import pack

pytestmark = pytest.mark.anyio

STEP_REQUIRED = ("episode_id", "group_id", "sample", "turn", "item", "actions", "reply_to")
CHARCLASS = {"text": "?", "meta": {"cls": "digits", "chars": "0123456789", "length": 4}}


def step_request(episode: str = "g0:0:n0", actions=("hi",), reply_to: str = "gen-0", **extra) -> dict:
    gid, sample, _ = episode.split(":")
    return {
        "schema": 1,
        "kind": "step_request",
        "episode_id": episode,
        "group_id": gid,
        "sample": int(sample),
        "turn": len(actions) - 1,
        "item": CHARCLASS,
        "actions": list(actions),
        "reply_to": reply_to,
        **extra,
    }


async def wait_for(probe, timeout: float = 20.0, what: str = ""):
    deadline = asyncio.get_running_loop().time() + timeout
    while not (got := await probe()):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.05)
    return got


def node_env(url: str, run: str, log, worker_id: str, *extra: str):
    from tests.nodejs import start_node_env

    return start_node_env(url, run, log, "--id", worker_id, "--latency-ms", "0,2", *extra)


def stop(proc, sig=None) -> None:
    import signal

    proc.send_signal(sig or signal.SIGTERM)
    proc.wait(timeout=20)


@pytest.mark.parametrize("reader", ["python", "node"])
async def test_step_requests_need_their_required_fields_and_env_failures_are_answers(config, broker, tmp_path, reader):
    """Environment steps, `step_request`: every field but `sent_at` is required; a request missing
    one is dead-lettered naming the field and acked. Rules, failures are answers: an env that raises
    answers with `error` set (`text`, `reward`, `done` present) and dead-letters the request."""
    from tests.integration.envs.test_env_worker import burst
    from workers.env import EnvWorker

    cfg = config.model_copy(deep=True)
    r = aioredis.Redis.from_url(config.broker.url)
    prefix = f"streamrl:{config.run.name}:"
    steps, dead = prefix + "env_steps", prefix + "deadletter"
    ids = {}
    for name in STEP_REQUIRED:
        bad = {k: v for k, v in step_request(f"g{len(ids)}:0:n0").items() if k != name}
        ids[(await r.xadd(steps, {"d": pack(bad)})).decode()] = name
    await r.xadd(steps, {"d": pack(step_request("e0:0:n0", item={"text": "?", "meta": {}}))})  # the env raises
    await r.xadd(steps, {"d": pack(step_request("h0:0:n0"))})  # a good one, without sent_at
    try:
        if reader == "python":
            cfg.env.fn = "charclass_dialog"
            w = EnvWorker(cfg, broker, "env-py-1")
            await w.start()
            await burst(w)
            await w.close()
        else:
            proc = node_env(config.broker.url, config.run.name, tmp_path / "node.log", "env-node-1")
            try:
                await wait_for(lambda: r.xlen(prefix + "observations:gen-0"), what="the node env's answers")
                await wait_for(
                    lambda: _acked(r, steps), what=f"every step acked (log: {(tmp_path / 'node.log').read_text()})"
                )
            finally:
                stop(proc)
        records = [json.loads(f[b"d"].partition(b"\n")[0]) for _, f in await r.xrange(dead)]
        by_id = {rec["entry_id"]: rec["reason"] for rec in records}
        for entry_id, name in ids.items():
            assert f"step_request is missing required field(s) {name}" in by_id[entry_id], (name, by_id)
        raised = [v for k, v in by_id.items() if k not in ids]
        assert len(raised) == 1 and "e0:0:n0" in raised[0], by_id
        obs = {}
        for _, f in await r.xrange(prefix + "observations:gen-0"):
            o = msgpack.unpackb(f[b"d"])
            obs[o["episode_id"]] = o
        assert sorted(obs) == ["e0:0:n0", "h0:0:n0"]  # nothing answered for the invalid requests
        assert obs["e0:0:n0"]["error"] and (obs["e0:0:n0"]["text"], obs["e0:0:n0"]["reward"]) == ("", 0.0)
        assert obs["e0:0:n0"]["done"] is False
        h = obs["h0:0:n0"]
        assert (h["text"], h["reward"], h["done"], h["error"], h["turn"]) == ("\ndigits:", 0.0, False, "", 0)
        assert h["env_worker"] == ("env-py-1" if reader == "python" else "env-node-1")
        assert await _acked(r, steps)
    finally:
        await r.aclose()


async def _acked(r, stream: str) -> bool:
    groups = {g["name"].decode(): g for g in await r.xinfo_groups(stream)}
    return "env" in groups and groups["env"]["pending"] == 0 and groups["env"]["lag"] == 0


def runner(cfg, broker, gen_id: str = "gen-0"):
    from streamrl.core.worker import Worker
    from streamrl.generate.env_channel import EnvChannel

    cfg = cfg.model_copy(deep=True)
    cfg.env.fn, cfg.env.observation_timeout_s = "external", 60
    worker = Worker(cfg, broker, gen_id)
    return EnvChannel(cfg, worker.consumer, worker.count)


def request_of(data: dict):
    from streamrl.core.messages import StepRequest

    return StepRequest(**{k: v for k, v in data.items() if k not in ("schema", "kind")})


@pytest.mark.parametrize(
    "change, why",
    [
        ({"reward": None}, "missing required field(s) reward"),
        ({"done": None}, "missing required field(s) done"),
        ({"text": None}, "missing required field(s) text"),
        ({"turn": None}, "missing required field(s) turn"),
        ({"reward": float("nan")}, "reward is NaN"),
        ({"kind": "rollout"}, "does not belong on this stream"),
    ],
    ids=["no-reward", "no-done", "no-text", "no-turn", "nan-reward", "wrong-kind"],
)
async def test_a_malformed_observation_fails_its_waiting_episode_at_once(config, broker, change, why):
    """`observation`: `text`, `reward`, `done` are required (never defaulted). A malformed observation
    that names a waiting episode is dead-lettered and fails that episode at once with the reason,
    not after env.observation_timeout_s (60 s here)."""
    from streamrl.generate.env_channel import READ_GROUP, EpisodeFailed

    r = runner(config, broker)
    await broker.ensure_group(r.stream, READ_GROUP)
    waiting = asyncio.create_task(r.observe(request_of(step_request())))
    raw = aioredis.Redis.from_url(config.broker.url)
    try:
        await wait_for(lambda: raw.xlen(r.keys.env_steps), what="the step request")
        obs = {"schema": 1, "kind": "observation", "episode_id": "g0:0:n0", "turn": 0, "text": "t", "reward": 0.25}
        obs = {**obs, "done": False, **change}
        await raw.xadd(r.stream, {"d": pack({k: v for k, v in obs.items() if v is not None})})
        t0 = asyncio.get_running_loop().time()
        await r.read_once()
        with pytest.raises(EpisodeFailed) as failed:
            await asyncio.wait_for(waiting, 5)
        assert asyncio.get_running_loop().time() - t0 < 5
        assert "g0:0:n0 was dead-lettered" in str(failed.value) and why in str(failed.value)
        (_, fields), *_ = await raw.xrange(r.keys.deadletter)
        assert why in json.loads(fields[b"d"].partition(b"\n")[0])["reason"]
    finally:
        await raw.aclose()


# -- Sticky routing, Access control (env user) ---------------------------------------------------
@pytest.fixture(scope="module")
def redis7(tmp_path_factory):
    from brokers.embedded import EmbeddedRedis
    from tests.integration.brokers.test_producer_acl import _binary

    binary = _binary(7)
    if binary is None:
        if os.environ.get("STREAMRL_REQUIRE_REDIS7") == "1":
            pytest.fail("STREAMRL_REQUIRE_REDIS7=1 but no redis-server/valkey-server >= 7 is on PATH")
        pytest.skip("no Redis >= 7 here (apt install redis-server)")
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis7"), binary=binary).start()
    yield server
    server.stop()


async def test_the_node_env_under_the_env_user_is_sticky_and_takes_over_a_dead_workers_stream(
    redis7, run_name, tmp_path
):
    """Access control: `streamrl envuser add` (Redis >= 7) is enough for an env worker: its steps,
    its heartbeat `<name>-*`, its own stream. Sticky routing: a heartbeat with `sticky: 1` gets the
    episode's next step on env_steps:<id>; when that heartbeat is gone another worker takes the
    stream over."""
    import signal

    from brokers.connect import connect
    from streamrl.config.schema import BrokerConfig, Config, RunConfig
    from streamrl.generate.env_channel import READ_GROUP
    from tests.integration.brokers.test_env_acl import envuser_add

    url = envuser_add(redis7.url, run_name, "node")
    admin = await connect(redis7.url, retries=3)
    cfg = Config(run=RunConfig(name=run_name), broker=BrokerConfig(url=redis7.url, claim_idle_ms=200, block_ms=50))
    r = runner(cfg, admin)
    keys = r.keys
    await admin.ensure_group(r.stream, READ_GROUP)
    reader = asyncio.create_task(_read_forever(r))
    a = node_env(url, run_name, tmp_path / "a.log", "node-a", "--claim-idle-ms", "500")
    b = None
    try:
        beat = await wait_for(lambda: admin.get(keys.worker("env", "node-a")), what="node-a's heartbeat")
        assert json.loads(beat)["sticky"] == 1
        first = await r.observe(request_of(step_request(actions=["hi"])))
        assert (first.env_worker, first.text, first.error) == ("node-a", "\ndigits:", ""), first
        second = await r.observe(request_of(step_request(actions=["hi", "12ab"])), env_worker=first.env_worker)
        assert (second.env_worker, second.reward, second.done) == ("node-a", 0.5, True)
        assert await admin.client.xlen(keys.env_steps_of("node-a")) == 1  # the second step went there
        assert await admin.client.xlen(keys.env_steps) == 1
        # node-a dies; a generator routes a step to it before its heartbeat goes (DEL: what the 15 s
        # TTL does); node-b takes that step over from node-a's stream.
        stop(a, signal.SIGKILL)
        g1 = request_of(step_request("g1:0:n0", actions=["hi", "7777"]))
        waiting = asyncio.create_task(r.observe(g1, env_worker="node-a"))
        await wait_for(
            lambda: _eq(admin.client.xlen(keys.env_steps_of("node-a")), 2), what="the step routed to dead node-a"
        )
        await admin.client.delete(keys.worker("env", "node-a"))
        b = node_env(url, run_name, tmp_path / "b.log", "node-b", "--claim-idle-ms", "500")
        third = await asyncio.wait_for(waiting, 30)
        assert (third.env_worker, third.reward, third.done) == ("node-b", 1.0, True)
        # The observation is written before the ack (a crash between the two redoes the step): wait for it.
        await wait_for(lambda: _acked(admin.client, keys.env_steps_of("node-a")), what="node-b's ack of the step")
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                stop(proc)
        reader.cancel()
        await admin.close()


async def _eq(value, expected) -> bool:
    return await value == expected


async def _read_forever(r) -> None:
    while True:
        if not await r.read_once():
            await asyncio.sleep(0.02)
