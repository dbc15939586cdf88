"""Real generator processes (vLLM CPU, real redis) SIGKILLed with their EngineCore mid-work.

1. Multi-turn: the generator running a group's episodes dies while they wait for an env step; the
   other generator continues each episode from its last model turn (same tokens, log-probs,
   versions) to the full turn count. Then, on the survivor, a non-replayable env's worker is
   SIGKILLed mid-step: the episodes it held restart from the prompt. Every episode is trained once
   (accounting invariant, through the real reward worker, assembler and step ledger).
2. Single-turn (issue 12.3): the generator dies right after a partial group's first publishes; the
   other regenerates the group under new rollout ids, and every trained sample's reward is the
   reward of its own tokens.

    pytest tests/integration/generate/test_generator_kill.py
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

from brokers.connect import connect
from streamrl.config.files import load_config
from streamrl.config.schema import TinyModelConfig
from streamrl.core.accounting import LedgerKeys, admit, log_step, summarize
from streamrl.core.broker import Keys
from streamrl.core.messages import EpisodeState, Prompt, decode, encode
from streamrl.envs.base import Env
from streamrl.models.tiny import build_tiny_model, vocab
from tests.integration.assemble.test_assembler import make
from tests.programs.env_fns import SlowAfterFirst
from tests.programs.gen_procs import REPO, Generators
from tests.programs.reward_fns import misbehave
from workers.env import EnvWorker
from workers.reward import RewardWorker

pytestmark = pytest.mark.anyio
G, TURNS = 2, 3
GATE: asyncio.Event | None = None


class GatedEcho(Env):
    """Deterministic, so replayable: step k answers "\\n<k>:"; steps after the first wait for GATE."""

    async def reset(self, item):
        self.n = 0

    async def step(self, action):
        self.n += 1
        if self.n > 1:
            await GATE.wait()
        return f"\n{self.n}:", float(len(action)), False


class QuickAfterFirst(SlowAfterFirst):
    def reset(self, item):
        super().reset(item)
        self.sleep = 0.0


def _config(url: str, run: str, model, **sections) -> dict:
    cfg = {
        "run": {"name": run, "seed": 0},
        "broker": {"url": url, "claim_idle_ms": 1500, "block_ms": 50},
        "model": {"path": str(model)},
        "rollout": {"group_size": G, "groups_per_step": 1},
        "generator": {
            "max_tokens": 4,
            "temperature": 1.0,
            "max_inflight_groups": 4,
            "drain_timeout_s": 0.5,
            "cpu_worker_in_engine": True,
        },  # no weight switch here; and no /dev/shm queues left
        "loss": {"kl_beta": 0.0},
        "weights": {"backend": "shm"},
    }
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    return cfg


def _prompt(gid: str, group_size: int = G, **meta) -> bytes:
    v = vocab()
    return encode(
        Prompt(
            group_id=gid, prompt_ids=[v["<s>"], v["?"]], group_size=group_size, admitted_version=0, text="?", meta=meta
        )
    )


async def _until(what: str, check, timeout: float = 120.0, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while not (out := await check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(every)
    return out


async def _rollouts(broker, keys, gid: str, n: int) -> list:
    async def got():
        rs = [decode(e.data) for e in await broker.read(keys.rollouts, count=10_000)]
        rs = [r for r in rs if r.group_id == gid]
        return sorted(rs, key=lambda r: r.sample) if len(rs) >= n else None

    return await _until(f"{n} rollouts of {gid}", got)


async def _train(cfg, broker, keys, step: int) -> list:
    """The trainer's side of one step: rewards (reward.fn env), a batch, the step ledger, the ack."""
    reward = RewardWorker(cfg, broker, f"reward-{step}")
    await reward.start()
    cfg, _, asm = make(cfg, broker)
    await asm.start()
    for _ in range(20):
        await reward.step()
    batch = await asyncio.wait_for(asm.next_batch(step - 1), 20)
    await log_step(broker, keys, step, batch.group_ids, [r.rollout_id for r in batch.rollouts])
    await asm.commit(batch)
    return batch


@pytest.mark.timeout(400)
async def test_episodes_continue_on_another_generator_and_restart_when_the_env_cannot_replay(redis_server, tmp_path):
    global GATE
    GATE = asyncio.Event()
    run = f"gk-{uuid.uuid4().hex[:6]}"
    model = build_tiny_model(TinyModelConfig(), tmp_path / "model", seed=0)
    conf = _config(
        redis_server.url,
        run,
        model,
        reward={"fn": "env"},
        env={"fn": "tests.programs.env_fns:SlowAfterFirst", "max_turns": TURNS},
    )
    gens = Generators(tmp_path, redis_server.url, run, conf, ["gen-a", "gen-b"])
    broker = await connect(redis_server.url)
    env_task = None
    try:
        cfg = load_config(tmp_path / "generator.yaml")
        keys = Keys(run)
        env = EnvWorker(cfg, broker, "env-0", factory=GatedEcho)
        env_task = asyncio.create_task(env.run())
        gens.wait_ready()

        # 1. The generator holding g0 dies while its episodes wait for their turn-1 observation.
        await admit(broker, keys, [_prompt("g0")], 1)
        state_key = f"{keys.prefix}episode_state:g0"

        async def both_at_turn_1():
            states = {int(k): decode(v, expect=EpisodeState) for k, v in (await broker.hgetall(state_key)).items()}
            return states if len(states) == G and all(s.turn == 1 for s in states.values()) else None

        saved = await _until("both episodes at turn 1", both_at_turn_1, timeout=240)
        victim = saved[0].writer
        survivor = next(w for w in gens.procs if w != victim)
        died = gens.sigkill(victim)
        assert len(died) >= 2, "the generator and its EngineCore child"
        GATE.set()
        first = await _rollouts(broker, keys, "g0", G)
        for r in first:
            kept = saved[r.sample]
            n = len(kept.completion_ids)
            assert r.worker == survivor and r.rollout_id != kept.episode_id
            assert r.completion_ids[:n].tolist() == kept.completion_ids.tolist()  # the turns done before the kill
            assert np.array_equal(r.logprobs[:n], kept.logprobs) and r.obs_spans[:1] == kept.obs_spans
            assert r.version == kept.version and r.meta["turns"] == TURNS and r.finish_reason == "max_turns"
            assert len(r.obs_spans) == TURNS - 1 and len(r.completion_ids) > n
            assert r.text.startswith("".join(kept.texts) + "\n2:")
        assert int(await broker.get(keys.stat("episodes_continued"))) == G
        assert await broker.hgetall(state_key) == {}  # dropped once the rollouts are out
        await _train(cfg, broker, keys, 1)

        # 2. A non-replayable env's worker is SIGKILLed inside a turn-1 step: those episodes restart.
        env.stop()
        await asyncio.wait_for(env_task, 30)
        env_task = None
        doomed = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "streamrl.cli",
                "env",
                "--fn",
                "tests.programs.env_fns:SlowAfterFirst",
                "--run",
                run,
                "--broker",
                redis_server.url,
                "--claim-idle-ms",
                "1500",
                "--id",
                "env-doomed",
            ],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            start_new_session=True,
            stdout=open(tmp_path / "env.out", "wb"),
            stderr=subprocess.STDOUT,
        )
        try:
            await admit(broker, keys, [_prompt("g1", sleep_after_first=60)], 2)

            async def turn1_taken():
                # Sticky routing: turn 1 goes to the own stream of the env worker that answered turn 0.
                mine, pending = [], 0
                for stream in (keys.env_steps, keys.env_steps_of("env-doomed")):
                    if not await broker.client.exists(stream):
                        continue
                    steps = [decode(e.data) for e in await broker.read(stream, count=10_000)]
                    mine += [s for s in steps if s.group_id == "g1" and s.turn == 1]
                    info = {g["name"]: g for g in await broker.group_info(stream)}
                    pending += info["env"]["pending"] if "env" in info else 0
                return mine if len(mine) == G and pending >= G else None

            interrupted = await _until("the doomed env worker inside both turn-1 steps", turn1_taken)
        finally:
            os.killpg(doomed.pid, signal.SIGKILL)
            doomed.wait(30)
        fresh = EnvWorker(cfg, broker, "env-1", factory=QuickAfterFirst)
        env_task = asyncio.create_task(fresh.run())
        second = await _rollouts(broker, keys, "g1", G)
        assert {r.rollout_id for r in second}.isdisjoint(s.episode_id for s in interrupted)
        assert all(r.meta["turns"] == TURNS and r.worker == survivor for r in second)
        assert fresh.stats["replay_refused"] == G
        assert int(await broker.get(keys.stat("episodes_restarted"))) == G
        await _train(cfg, broker, keys, 2)

        await broker.set(LedgerKeys(keys).checkpointed, 2)
        s = summarize(redis_server.url, run, episodes_per_group=G)
        assert s["invariant_holds"] and s["trained"] == 2 and s["lost"] == 0 and s["double_trained"] == 0, s
        e = s["episodes"]
        assert e["trained"] == 2 * G and e["episodes_continued"] == G and e["episodes_restarted"] == G, e
        assert e["groups_restarted"] == 1 and s["dead_lettered"] == G, s  # the steps refused for replay
    finally:
        GATE.set()
        if env_task is not None:
            env_task.cancel()
            await asyncio.gather(env_task, return_exceptions=True)
        gens.close()
        await broker.close()


@pytest.mark.timeout(400)
async def test_a_generator_killed_after_a_partial_groups_first_publishes(redis_server, tmp_path):
    """Issue 12.3 with a real SIGKILL: its claimed group is regenerated by the other generator under
    new rollout ids; the trainer takes the first copy of each sample, with that copy's reward."""
    n = 8
    run = f"gk1-{uuid.uuid4().hex[:6]}"
    model = build_tiny_model(TinyModelConfig(), tmp_path / "model", seed=0)
    conf = _config(
        redis_server.url,
        run,
        model,
        rollout={"group_size": n},
        generator={"max_tokens": 200},
        reward={"fn": "tests.programs.reward_fns:misbehave"},
    )
    gens = Generators(tmp_path, redis_server.url, run, conf, ["gen-a", "gen-b"])
    broker = await connect(redis_server.url)
    try:
        cfg = load_config(tmp_path / "generator.yaml")
        keys = Keys(run)
        gens.wait_ready()
        await admit(broker, keys, [_prompt("g0", group_size=n)], 1)
        entries = await _until(
            "the group's first publish", lambda: broker.read(keys.rollouts, block_ms=1000), timeout=120, every=0
        )
        victim = decode(entries[0].data).worker
        gens.sigkill(victim)  # a few ms after its first publish
        before = [r for r in (decode(e.data) for e in await broker.read(keys.rollouts, count=1000))]
        assert 1 <= len(before) < n, f"{len(before)} of {n} published before the kill: the group was not partial"
        survivor = next(w for w in gens.procs if w != victim)
        after = await _rollouts(broker, keys, "g0", len(before) + n)
        assert sum(r.worker == survivor for r in after) == n  # the whole group, generated again
        assert len({r.rollout_id for r in after}) == len(after)  # every copy has its own id

        batch = await _train(cfg, broker, keys, 1)
        first = {r.sample: r for r in before}
        assert sorted(r.sample for r in batch.rollouts) == list(range(n))
        for r, reward in zip(batch.rollouts, batch.rewards):
            assert reward == pytest.approx(misbehave(r.prompt_text, r.text, r.meta)), r.rollout_id
            if r.sample in first:
                assert r.rollout_id == first[r.sample].rollout_id  # the first copy read is trained
        await broker.set(LedgerKeys(keys).checkpointed, 1)
        s = summarize(redis_server.url, run)
        assert s["invariant_holds"] and s["trained"] == 1 and s["double_trained"] == 0 and s["lost"] == 0, s
    finally:
        gens.close()
        await broker.close()
