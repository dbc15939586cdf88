"""Env role: run the environment steps of multi-turn episodes, answer each with an observation.

    streamrl worker env --config configs/tiny-multiturn-cpu.yaml --broker redis://... --run tiny
    streamrl env --fn my_envs:Calculator --run tiny --broker redis://...       # a user env class

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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from streamrl.config.schema import Config
from streamrl.core.broker import Broker, Entry
from streamrl.core.errors import ConfigError
from streamrl.core.messages import Observation, StepRequest, encode
from streamrl.core.worker import Worker
from streamrl.envs.base import Env, check_step
from streamrl.envs.resolve import env_factory, resolve_env

GROUP = "env"
MAX_CACHED = 4096
"""Episodes whose env instance a worker keeps (least recently used beyond it are replayed if needed)."""
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
        self.tasks: set[asyncio.Task] = set()
        self.pool = ThreadPoolExecutor(max_workers=cfg.env.concurrency, thread_name_prefix="env-step")

    async def start(self) -> None:
        if self.factory is None:
            if not self.cfg.env.fn:
                raise ConfigError("an env worker needs env.fn (a built-in env or package.module:Class)")
            self.factory = resolve_env(self.cfg.env.fn, tuple(self.cfg.env.latency_ms))
        self.factory = env_factory(self.factory, self.cfg)
        probe = self.factory()
        self.replayable = bool(getattr(probe, "replayable", True))
        self.is_async = inspect.iscoroutinefunction(probe.step)
        await self.broker.ensure_group(self.keys.env_steps, GROUP)

    async def step(self) -> bool:
        free = self.cfg.env.concurrency - len(self.tasks)
        if free <= 0:  # read only what can start now: the rest stays for other workers
            await asyncio.wait(
                list(self.tasks), timeout=self.cfg.broker.block_ms / 1000, return_when=asyncio.FIRST_COMPLETED
            )
            return False
        items = await self.read(self.keys.env_steps, GROUP, count=free, expect=StepRequest)
        for entry, req in items:
            if self.consumer.is_held(self.keys.env_steps, GROUP, entry.id):
                continue  # our own step in progress, re-read with the pending entries
            self.hold(self.keys.env_steps, GROUP, entry.id)
            task = asyncio.create_task(self._handle(entry, req))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return bool(items)

    async def _handle(self, entry: Entry, req: StepRequest) -> None:
        t0 = time.monotonic()
        try:
            obs = await self._answer(req)
            obs.step_s = round(time.monotonic() - t0, 6)
            if obs.error:
                await self.dead_letter(
                    self.keys.env_steps, entry, f"episode {req.episode_id} turn {req.turn}: {obs.error}"
                )
                self.count("step_errors")
            await self.broker.add(self.keys.observations(req.reply_to), encode(obs), maxlen=OBS_MAXLEN)
            await self.broker.ack(self.keys.env_steps, GROUP, [entry.id])
            self.count("steps")
        except Exception as exc:  # broker trouble: leave the step pending; it is claimed and redone
            self.log.error("step_failed", error=repr(exc), episode_id=req.episode_id)
        finally:
            self.release(self.keys.env_steps, GROUP, entry.id)

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
                    fut = asyncio.get_running_loop().run_in_executor(self.pool, _drive_sync, state, req)
                    text, reward, done, info = await asyncio.wait_for(fut, timeout)
            except asyncio.TimeoutError:
                self.states.pop(req.episode_id, None)  # a hung call may still be mutating it
                self.count("step_timeouts")
                return self._obs(req, error=f"env step timed out after {timeout:g}s (env.step_timeout_s)")
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
        if self.tasks:  # drain: finish the steps already taken, so they are acked, not redone
            await asyncio.wait(list(self.tasks), timeout=self.cfg.env.step_timeout_s)
        self.pool.shutdown(wait=False, cancel_futures=True)


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
