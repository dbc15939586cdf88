"""Env role: run the environment steps of multi-turn episodes, answer each with an observation.

    streamrl worker env --config configs/tiny-multiturn-cpu.yaml --broker redis://... --run tiny
    streamrl env --fn my_envs:Calculator --run tiny --broker redis://...       # a user env class

Sticky routing: generators send an episode's later steps to this worker's own stream
`env_steps:{worker id}` while its heartbeat (with `sticky`) lives, so its cached state is reused; it
reads that stream first, then the shared one, and takes over the own streams of workers whose
heartbeat is gone (docs/protocol.md, "Sticky routing").
Reads `env_steps` with the consumer group "env" (workers of this role share the load), runs up to
env.concurrency steps at once, writes one Observation to `observations:{reply_to}` per step and
only then acks it. Env instances are cached per episode; a step for an episode this worker has
not seen (another worker died mid-episode and its pending step was claimed here) is replayed:
reset(item) and every earlier action, then the new one. A non-replayable env answers such a step
with error_kind "replay" (the generator restarts the episode). An env that raises, returns
garbage, or runs past env.step_timeout_s answers with `error` set (the episode fails) and the
step request is dead-lettered with the reason; the worker carries on.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from streamrl.config.rollout import EXTERNAL
from streamrl.config.schema import Config
from streamrl.core.bounded_tasks import InFlight, settle_cancelled
from streamrl.core.broker import Broker, Entry
from streamrl.core.calls import Calls, CallTimeout
from streamrl.core.errors import ConfigError
from streamrl.core.messages import Observation, StepRequest, encode
from streamrl.core.worker import Worker
from streamrl.envs.base import Env, check_step
from streamrl.envs.resolve import env_factory, resolve_env

GROUP = "env"
MAX_CACHED = 4096
"""Episodes whose env instance a worker keeps (least recently used beyond it are replayed if needed)."""
STOP_DRAIN_S = 3.0
"""On stop, how long the steps in progress may take to finish (at most env.step_timeout_s)."""
OBS_MAXLEN = 100_000
"""Approximate cap of an observations stream (its generator reads it as it arrives)."""


@dataclass
class _State:
    env: Env
    turns: int = -1
    """Steps applied so far; -1: not reset yet."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class EnvWorker(Worker):
    role = "env"

    def __init__(self, cfg: Config, broker: Broker, worker_id: str, run_dir=None, factory: Callable | None = None):
        super().__init__(cfg, broker, worker_id, run_dir)
        self.factory = factory
        self.states: OrderedDict[str, _State] = OrderedDict()
        self.steps = InFlight(cfg.env.concurrency, self.consumer, self.keys.env_steps, GROUP)
        """Env steps being answered, each holding its step request (of the shared or a worker's own stream)."""
        # Sync env calls run on Calls' daemon threads: one that never returns retires its thread (a
        # fresh one takes the next call) and is never joined, so it costs neither a slot nor the exit.
        self.calls = Calls("env-step")

    async def start(self) -> None:
        if self.factory is None:
            if not self.cfg.env.fn or self.cfg.env.fn == EXTERNAL:
                raise ConfigError(
                    f"an env worker needs env.fn (a built-in env or package.module:Class), not {self.cfg.env.fn!r}: "
                    "with env.fn=external the job's env workers are started outside it (streamrl env --fn ...)"
                )
            self.factory = resolve_env(self.cfg.env.fn, tuple(self.cfg.env.latency_ms))
        self.factory = env_factory(self.factory, self.cfg)
        probe = self.factory()
        self.env_name = self.cfg.env.fn if self.cfg.env.fn and self.cfg.env.fn != EXTERNAL else type(probe).__name__
        """What a timed-out step names: env.fn (`streamrl env --fn` sets it too), else the env's class."""
        self.replayable = bool(getattr(probe, "replayable", True))
        self.is_async = inspect.iscoroutinefunction(probe.step)
        await self.broker.ensure_group(self.keys.env_steps, GROUP)
        self.own = self.keys.env_steps_of(self.worker_id)
        await self.broker.ensure_group(self.own, GROUP)
        self._orphan_scan = 0.0

    async def step(self) -> bool:
        # Read only what can start now: the rest stays for other workers.
        if not await self.steps.wait_slot(timeout=self.cfg.broker.block_ms / 1000):
            return False
        free = self.steps.free()
        # Steps routed here first (their episodes' state is cached here), then the shared ones, then
        # those routed to a worker that has died (no heartbeat: takeover, replayed here). Each batch
        # starts before the next read, which may block broker.block_ms.
        got = self._launch(self.own, await self.read(self.own, GROUP, count=free, expect=StepRequest))
        if got < free:
            got += self._launch(
                self.keys.env_steps, await self.read(self.keys.env_steps, GROUP, count=free - got, expect=StepRequest)
            )
        if got < free:
            for stream, items in await self._orphaned(free - got):
                got += self._launch(stream, items)
        return got > 0

    def _launch(self, stream: str, items: list) -> int:
        for entry, req in items:
            if self.steps.holds(stream, entry.id):
                continue  # our own step in progress, re-read with the pending entries
            self.steps.start(self._handle(stream, entry, req), hold=[entry.id], stream=stream)
        return len(items)

    async def _orphaned(self, count: int) -> list:
        """[(stream, items)]: steps routed to env workers whose heartbeat is gone, checked every
        broker.claim_idle_ms."""
        now = time.monotonic()
        if now - self._orphan_scan < self.cfg.broker.claim_idle_ms / 1000:
            return []
        self._orphan_scan = now
        out: list = []
        for stream in await self.broker.scan(self.keys.env_steps + ":*"):
            owner = stream[len(self.keys.env_steps) + 1 :]
            if count <= 0 or owner == self.worker_id:
                continue
            if await self.broker.get(self.keys.worker(self.role, owner)) is None:
                if not await self._has_work(stream):
                    continue  # drained (a read would block broker.block_ms on it for nothing)
                got = await self.read(stream, GROUP, count=count, expect=StepRequest)
                out.append((stream, got))
                count -= len(got)
        return out

    async def _has_work(self, stream: str) -> bool:
        try:
            group = next((g for g in await self.broker.group_info(stream) if g["name"] == GROUP), None)
        except Exception:  # Redis 6.2 counts the lag with a script, which an env user may not run
            return True
        return group is not None and bool(group["pending"] or group["lag"] or group["lag"] is None)

    def heartbeat(self) -> dict:
        # `sticky`: generators route an episode's next step to this worker's own stream.
        return {**super().heartbeat(), "sticky": 1}

    async def _handle(self, stream: str, entry: Entry, req: StepRequest) -> None:
        t0 = time.monotonic()
        try:
            obs = await self._answer(req)
            obs.step_s = round(time.monotonic() - t0, 6)
            if obs.error:
                await self.dead_letter(stream, entry, f"episode {req.episode_id} turn {req.turn}: {obs.error}")
                self.count("step_errors")
            await self.broker.add(self.keys.observations(req.reply_to), encode(obs), maxlen=OBS_MAXLEN)
            await self.broker.ack(stream, GROUP, [entry.id])
            self.count("steps")
        except Exception as exc:  # broker trouble: leave the step pending; it is claimed and redone
            self.log.error("step_failed", error=repr(exc), episode_id=req.episode_id)

    async def _answer(self, req: StepRequest) -> Observation:
        state = self.states.get(req.episode_id)
        if state is None or state.turns > req.turn:
            # Not seen here (or a redelivery of an older step): rebuild from the item and the actions.
            if req.turn > 0 and not self.replayable:
                self.count("replay_refused")
                return self._obs(
                    req,
                    error="this env is not replayable and lost the episode's state "
                    "(its worker died or evicted it); the episode restarts",
                    error_kind="replay",
                )
            if req.turn > 0:
                self.count("replays")
            state = _State(self.factory())
        self.states[req.episode_id] = state
        self.states.move_to_end(req.episode_id)
        while len(self.states) > MAX_CACHED:
            self.states.popitem(last=False)
        # Each step (replayed ones too) gets env.step_timeout_s; reset counts with the first step.
        timeout = self.cfg.env.step_timeout_s * (req.turn - max(state.turns, 0) + 1)
        async with state.lock:
            try:
                if self.is_async:
                    text, reward, done, info = await asyncio.wait_for(_drive_async(state, req), timeout)
                else:
                    text, reward, done, info = await self.calls.run(_drive_sync, state, req, timeout=timeout)
            except (asyncio.TimeoutError, CallTimeout):
                self.states.pop(req.episode_id, None)  # a hung call may still be mutating it
                self.count("step_timeouts")
                return self._obs(
                    req, error=f"env step timed out after {timeout:g}s in {self.env_name} (env.step_timeout_s)"
                )
            except Exception as exc:  # user code: this episode's failure, not the worker's
                self.states.pop(req.episode_id, None)
                return self._obs(req, error=f"env raised {type(exc).__name__}: {exc}")
        if done:
            self.states.pop(req.episode_id, None)
        return self._obs(req, text=text, reward=reward, done=done, messages=info["messages"], counts=info["counts"])

    def _obs(self, req: StepRequest, **fields) -> Observation:
        return Observation(episode_id=req.episode_id, turn=req.turn, env_worker=self.worker_id, **fields)

    def stop_budget_s(self) -> float:
        return self.cfg.env.step_timeout_s + 10.0

    async def close(self) -> None:
        # Drain: finish the steps already taken, so they are acked, not redone; but not for all of
        # env.step_timeout_s: a step that never returns would hold every stop that long. One left
        # running stays pending and is redone (replayed) by whoever takes it over.
        late = await self.steps.drain(timeout=min(self.cfg.env.step_timeout_s, STOP_DRAIN_S))
        if late:
            self.log.warning("steps_left_running", steps=len(late), waited_s=STOP_DRAIN_S)
        for task in late:
            task.cancel()
        await settle_cancelled(late, self.log, "env steps", 1.0)
        self.calls.close()  # never joins a thread stuck in a step: they are daemons


def _drive_sync(state: _State, req: StepRequest) -> tuple[str, float, bool, dict]:
    """Bring the env to turn `req.turn` (reset, replay earlier actions) and step the newest action."""
    if state.turns < 0:
        state.env.reset(req.item)
        state.turns = 0
    while state.turns < req.turn:
        check_step(state.env.step(req.actions[state.turns]))
        state.turns += 1
    out = check_step(state.env.step(req.actions[req.turn]))
    state.turns += 1
    return out


async def _drive_async(state: _State, req: StepRequest) -> tuple[str, float, bool, dict]:
    if state.turns < 0:
        out = state.env.reset(req.item)
        if inspect.isawaitable(out):
            await out
        state.turns = 0
    while state.turns < req.turn:
        check_step(await state.env.step(req.actions[state.turns]))
        state.turns += 1
    out = check_step(await state.env.step(req.actions[req.turn]))
    state.turns += 1
    return out
