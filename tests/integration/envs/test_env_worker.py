"""Env workers against a real redis-server: steps answered, replay on another worker, takeover of a
SIGKILLed worker's step, non-replayable envs, timeouts and bad output dead-lettered (never fatal)."""

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamrl.core.errors import DecodeError
from streamrl.core.messages import Observation, StepRequest, decode, encode
from workers.env import GROUP, EnvWorker

pytestmark = pytest.mark.anyio


def env_config(config, fn: str, **env):
    cfg = config.model_copy(deep=True)
    cfg.env.fn = fn
    for k, v in env.items():
        setattr(cfg.env, k, v)
    return cfg


def request(actions: list[str], episode: str = "g0:0:a", sleep: float = 0.0) -> StepRequest:
    return StepRequest(
        episode_id=episode,
        group_id="g0",
        sample=0,
        turn=len(actions) - 1,
        item={"text": "?", "meta": {"sleep": sleep}},
        actions=actions,
        reply_to="gen-0",
    )


async def observations(broker, keys, n: int, timeout: float = 10.0) -> list[Observation]:
    deadline = time.monotonic() + timeout
    while True:
        out = [decode(e.data) for e in await broker.read(keys.observations("gen-0"), count=1000)]
        if len(out) >= n or time.monotonic() > deadline:
            return out
        await asyncio.sleep(0.05)


def env_cli(args: list[str], out: Path) -> subprocess.Popen:
    """`streamrl ARGS` (an env worker) in its own session, its output in `out`."""
    return subprocess.Popen(
        [sys.executable, "-m", "streamrl.cli", *args],
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        stdout=open(out, "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


async def burst(worker: EnvWorker, idle_rounds: int = 3) -> None:
    """Run the worker until it has been idle a few rounds and nothing is in flight."""
    idle = 0
    while idle < idle_rounds:
        busy = await worker.step()
        idle = 0 if busy or worker.steps.tasks else idle + 1
        if worker.steps.tasks:
            await asyncio.wait(list(worker.steps.tasks), timeout=5)


@pytest.mark.parametrize("fn", ["Counter", "AsyncCounter"])
async def test_steps_are_answered_and_replayed_on_another_worker(config, broker, fn):
    cfg = env_config(config, f"tests.programs.env_fns:{fn}")
    a, b = EnvWorker(cfg, broker, "env-a"), EnvWorker(cfg, broker, "env-b")
    await a.start()
    await b.start()
    for actions in (["x"], ["x", "yy"]):
        await broker.add(a.keys.env_steps, encode(request(actions)))
        await burst(a)
    # Turn 2 lands on a worker that never saw the episode: it replays reset + x + yy, then steps.
    await broker.add(b.keys.env_steps, encode(request(["x", "yy", "stop"])))
    await burst(b)
    obs = await observations(broker, a.keys, 3)
    assert [(o.turn, o.text, o.reward, o.done) for o in obs] == [
        (0, "1:x", 1.0, False),
        (1, "2:x|yy", 2.0, False),
        (2, "3:x|yy|stop", 4.0, True),
    ]
    assert [o.env_worker for o in obs] == ["env-a", "env-a", "env-b"]
    assert a.stats.get("replays", 0) == 0 and b.stats["replays"] == 1
    assert all(o.error == "" and o.step_s >= 0 for o in obs)
    info = {g["name"]: g for g in await broker.group_info(a.keys.env_steps)}
    assert info[GROUP]["pending"] == 0


async def test_a_sigkilled_workers_step_is_taken_over_and_redone(config, broker, tmp_path):
    cfg = env_config(config, "tests.programs.env_fns:Counter")
    keys = EnvWorker(cfg, broker, "probe").keys
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamrl.cli",
            "env",
            "--fn",
            "tests.programs.env_fns:Counter",
            "--run",
            cfg.run.name,
            "--broker",
            cfg.broker.url,
            "--claim-idle-ms",
            "200",
            "--id",
            "env-doomed",
        ],
        env=env,
        stdout=open(tmp_path / "env.out", "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        await broker.add(keys.env_steps, encode(request(["a", "b"], sleep=30)))  # a 30 s tool call
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            info = {g["name"]: g for g in await broker.group_info(keys.env_steps)}
            if info.get(GROUP, {}).get("pending"):
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail(f"the subprocess env worker never took the step:\n{(tmp_path / 'env.out').read_text()}")
        await asyncio.sleep(0.3)  # it is now inside step(); its keepalive keeps the entry from being claimed
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # The survivor's env is fast: the taken-over step is replayed (reset + "a") and redone here.
    survivor = EnvWorker(cfg, broker, "env-survivor", factory=lambda: _fast(cfg))
    await survivor.start()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 10 and not survivor.stats.get("steps"):
        await survivor.step()
        if survivor.steps.tasks:
            await asyncio.wait(list(survivor.steps.tasks), timeout=5)
    obs = await observations(broker, keys, 1)
    assert len(obs) == 1 and obs[0].text == "2:a|b" and obs[0].env_worker == "env-survivor"
    assert survivor.stats["replays"] == 1
    info = {g["name"]: g for g in await broker.group_info(keys.env_steps)}
    assert info[GROUP]["pending"] == 0


def _fast(cfg):
    from tests.programs.env_fns import Counter

    class Fast(Counter):
        def reset(self, item):
            super().reset({"meta": {}})

    return Fast()


async def test_non_replayable_env_says_so(config, broker):
    cfg = env_config(config, "tests.programs.env_fns:OneShot")
    w = EnvWorker(cfg, broker, "env-a")
    await w.start()
    await broker.add(w.keys.env_steps, encode(request(["x"], episode="g0:0:a")))
    await broker.add(w.keys.env_steps, encode(request(["x", "y"], episode="g0:0:b")))  # never seen here
    await burst(w)
    obs = {o.episode_id: o for o in await observations(broker, w.keys, 2)}
    assert obs["g0:0:a"].error == "" and obs["g0:0:a"].text == "1:x"
    assert obs["g0:0:b"].error_kind == "replay" and "not replayable" in obs["g0:0:b"].error
    assert w.stats["replay_refused"] == 1


async def test_timeouts_errors_and_garbage_fail_only_their_episode(config, broker):
    cfg = env_config(config, "tests.programs.env_fns:Misbehave", step_timeout_s=0.5)
    w = EnvWorker(cfg, broker, "env-a")
    await w.start()
    actions = ["hang", "raise", "garbage", "nan", "fine"]
    for i, a in enumerate(actions):
        await broker.add(w.keys.env_steps, encode(request([a], episode=f"g{i}:0:a")))
    await broker.add(w.keys.env_steps, b"not msgpack")
    await broker.client.xadd(w.keys.env_steps, {"d": encode(Observation(episode_id="x", turn=0))})  # wrong kind
    t0 = time.monotonic()
    await burst(w)
    assert time.monotonic() - t0 < 3, "a hung env call must not hold up the other steps for long"
    obs = {o.episode_id: o for o in await observations(broker, w.keys, 5)}
    assert "timed out after 0.5s" in obs["g0:0:a"].error
    assert "raised RuntimeError: tool crashed" in obs["g1:0:a"].error
    assert "must return (observation" in obs["g2:0:a"].error
    assert "reward nan" in obs["g3:0:a"].error
    assert obs["g4:0:a"].error == "" and obs["g4:0:a"].text == "ok"
    dead = await broker.read(w.keys.deadletter, count=100)
    reasons = [e.data.split(b"\n", 1)[0].decode() for e in dead]
    assert len(dead) == 6, reasons
    assert sum("not valid msgpack" in r for r in reasons) == 1
    assert sum("does not belong on this stream" in r for r in reasons) == 1
    info = {g["name"]: g for g in await broker.group_info(w.keys.env_steps)}
    assert info[GROUP]["pending"] == 0
    with pytest.raises(DecodeError):
        decode(b"not msgpack")


async def test_calls_that_never_return_cost_no_slot_and_do_not_hold_up_exit(config, broker, tmp_path):
    """More never-returning sync calls than env.concurrency: each times out and retires its thread,
    later steps are still answered, and SIGTERM ends the worker promptly (nothing joins the threads)."""
    cfg = env_config(config, "tests.programs.env_fns:Misbehave")
    keys = EnvWorker(cfg, broker, "probe").keys
    # The env CLI's flags, not a config file: --concurrency 2 --step-timeout 0.5.
    args = ["env", "--fn", "tests.programs.env_fns:Misbehave", "--run", cfg.run.name, "--broker", cfg.broker.url]
    args += ["--concurrency", "2", "--step-timeout", "0.5", "--id", "env-wedged"]
    proc = env_cli(args, tmp_path / "env.out")
    try:
        for i in range(5):
            await broker.add(keys.env_steps, encode(request(["forever"], episode=f"h{i}:0:a")))
        for i in range(3):
            await broker.add(keys.env_steps, encode(request(["fine"], episode=f"f{i}:0:a")))
        obs = {o.episode_id: o for o in await observations(broker, keys, 8, timeout=60)}
        log = (tmp_path / "env.out").read_text()
        assert len(obs) == 8, log
        assert all("timed out after 0.5s" in obs[f"h{i}:0:a"].error for i in range(5))
        assert all(obs[f"f{i}:0:a"].error == "" and obs[f"f{i}:0:a"].text == "ok" for i in range(3))
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the env worker did not exit within 15 s of SIGTERM (it joins its hung threads):\n{log}")
        assert time.monotonic() - t0 < 15
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


async def _serve(worker: EnvWorker, stop: asyncio.Event) -> None:
    """Worker.run's loop with its heartbeat (what generators route on), until `stop`."""
    import json

    from streamrl.core.worker import HEARTBEAT_TTL_S

    key = worker.keys.worker("env", worker.worker_id)
    while not stop.is_set():
        await worker.broker.set(key, json.dumps(worker.heartbeat()), ttl_s=HEARTBEAT_TTL_S)
        await worker.step()
    if worker.steps.tasks:
        await asyncio.wait(list(worker.steps.tasks), timeout=5)
    await worker.broker.delete(key)


async def test_an_episodes_steps_stay_on_the_env_worker_holding_it_until_it_dies(config, broker):
    """Sticky routing (issue 27.5): with two env workers no step is replayed while both live; once one
    is gone, a step already routed to it is taken over (replayed) by the other, and its episodes'
    next steps go to the shared stream."""
    from streamrl.core.worker import Worker
    from streamrl.generate.env_channel import READ_GROUP, EnvChannel

    cfg = env_config(config, "tests.programs.env_fns:Counter", concurrency=4)  # 50 ms steps: both take first steps
    # The fixture's 200 ms claim window lets a loaded machine hand a live worker's pending first step to
    # the other one too (both then hold the episode, and no takeover replays it): only dead workers' steps here.
    cfg.broker.claim_idle_ms = 2000
    a, b = EnvWorker(cfg, broker, "env-a"), EnvWorker(cfg, broker, "env-b")
    generator = Worker(cfg, broker, "gen-0")
    runner = EnvChannel(cfg, generator.consumer, generator.count)
    await broker.ensure_group(runner.stream, READ_GROUP)
    stops = {w.worker_id: asyncio.Event() for w in (a, b)}
    for w in (a, b):
        await w.start()
    serving = {w.worker_id: asyncio.create_task(_serve(w, stops[w.worker_id])) for w in (a, b)}

    async def read_forever():
        while not runner._closing:
            await runner.read_once()

    reading = asyncio.create_task(read_forever())

    async def episode(i: int, turns: int) -> str:
        actions, worker = [], ""
        for t in range(turns):
            actions.append(f"t{t}")
            obs = await asyncio.wait_for(runner.observe(request(list(actions), f"g{i}:0:a", 0.05), worker), 20)
            assert obs.error == "" and obs.text == f"{t + 1}:" + "|".join(actions), obs
            worker = obs.env_worker
        return worker

    try:
        last = await asyncio.gather(*(episode(i, 3) for i in range(16)))
        assert set(last) == {"env-a", "env-b"}, last  # the shared first steps went to both
        assert a.stats.get("replays", 0) == 0 and b.stats.get("replays", 0) == 0
        stops["env-a"].set()
        await serving["env-a"]
        # A step routed to env-a after its last read: env-b takes it over (and replays the episode).
        eid = f"g{last.index('env-a')}:0:a"
        fut = asyncio.get_running_loop().create_future()
        runner.waiting[(eid, 3)] = fut
        await broker.add(a.keys.env_steps_of("env-a"), encode(request(["t0", "t1", "t2", "t3"], episode=eid)))
        obs = await asyncio.wait_for(fut, 20)
        assert obs.env_worker == "env-b" and obs.text == "4:t0|t1|t2|t3" and b.stats["replays"] == 1
        assert await runner._route("env-a") == a.keys.env_steps  # no heartbeat: the shared stream
    finally:
        for stop in stops.values():
            stop.set()
        await asyncio.gather(*serving.values())
        runner._closing = True
        await reading
