"""A generator's exchange with env workers: step requests out, observations back to the episode
waiting for each (streamrl/generate/episode_runner.py runs the episodes over it).

    env = EnvChannel(cfg, generator.consumer, generator.count); await env.start()
    obs = await env.observe(step_request, env_worker)   # the episode waits, holding no engine slot
    await env.close()

A step goes to the own stream of the env worker that answered the episode's last step while that
worker lives and reads it, else to the shared `env_steps`. A reader task consumes
`observations:{generator id}` and resolves the waiting futures. An observation that does not decode
fails the episode it names at once; none within env.observation_timeout_s fails it too; one nobody
waits for (a redone step's duplicate, an episode that already failed) is acked and counted as ignored.
With env.lockstep the episodes also wait for each other's observations (`Lockstep`).
"""

from __future__ import annotations

import asyncio
import json
from typing import Callable

from streamrl.config.schema import Config
from streamrl.core.broker import Entry
from streamrl.core.consumer import StreamConsumer
from streamrl.core.messages import Observation, StepRequest, encode, peek_field

READ_GROUP = "episodes"
"""Consumer group on observations:{generator id} (one consumer: the generator itself)."""
STEPS_MAXLEN = 100_000
"""Approximate cap of an env worker's own steps stream (the trainer trims only the shared streams)."""


class EpisodeFailed(Exception):
    """An episode cannot finish: the reason goes to the dead-letter stream and the logs."""


class EnvChannel:
    def __init__(self, cfg: Config, consumer: StreamConsumer, count: Callable[..., None]):
        """`consumer`: the generator's (its name is the generator id; its broker, keys and log serve
        here too); `count`: the generator's counters (`observations_ignored`)."""
        self.cfg = cfg
        self.consumer = consumer
        self.broker, self.keys, self.log = consumer.broker, consumer.keys, consumer.log
        self.count = count
        self.stream = self.keys.observations(consumer.name)
        self.waiting: dict[tuple[str, int], asyncio.Future] = {}
        """(episode id, turn) -> the future its observation resolves."""
        self._reader: asyncio.Task | None = None
        self._closing = False
        self._routed: set[str] = set()

    async def start(self) -> None:
        await self.broker.ensure_group(self.stream, READ_GROUP)
        await self.broker.ensure_group(self.keys.env_steps, "env")  # steps wait even before an env joins
        self._reader = asyncio.create_task(self._read_loop())

    async def close(self) -> None:
        """Stop the reader between reads: cancelling it inside a blocking XREADGROUP was seen to
        leave the stop waiting on redis-py's shielded command for good."""
        self._closing = True
        if self._reader is not None:
            _, stuck = await asyncio.wait({self._reader}, timeout=self.cfg.broker.block_ms / 1000 + 2)
            for task in stuck:
                task.cancel()

    async def _read_loop(self) -> None:
        while not self._closing:
            try:
                await self.read_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # broker hiccup: episodes keep waiting (bounded by their timeout)
                self.log.warning("observation_read_failed", error=repr(exc))
                await asyncio.sleep(0.5)

    async def read_once(self) -> int:
        """Deliver what is on this generator's observation stream; malformed entries are
        dead-lettered (StreamConsumer.read), observations nobody waits for (a redone step's duplicate,
        an episode that already failed) are acked and counted as ignored."""
        items = await self.consumer.read(
            self.stream, READ_GROUP, count=256, expect=Observation, claim=False, on_bad=self._rejected
        )
        for _, obs in items:
            fut = self.waiting.get((obs.episode_id, obs.turn))
            if fut is not None and not fut.done():
                fut.set_result(obs)
            else:
                self.count("observations_ignored")
        if items:
            await self.broker.ack(self.stream, READ_GROUP, [e.id for e, _ in items])
        return len(items)

    def _rejected(self, entry: Entry, reason: str) -> None:
        """A dead-lettered observation that names a waiting episode fails it now, with the real
        reason, instead of after env.observation_timeout_s with a guess. An episode waits on one
        turn at a time, so its id alone finds it (the turn may be what is missing or wrong)."""
        episode_id = peek_field(entry.data, "episode_id")
        for (eid, turn), fut in list(self.waiting.items()):
            if eid == episode_id and not fut.done():
                fut.set_exception(
                    EpisodeFailed(f"the observation for turn {turn} of {eid} was dead-lettered: {reason}")
                )

    async def _route(self, env_worker: str) -> str:
        """The stream for an episode's next step: the own stream of the env worker that answered its
        last one while that worker lives and reads it (`sticky` in its heartbeat), so the episode's
        state is reused there instead of replayed elsewhere; else the shared `env_steps`. A worker
        that dies after this check leaves the step to the others (workers/env.py takes it over)."""
        if not env_worker:
            return self.keys.env_steps
        try:
            raw = await self.broker.get(self.keys.worker("env", env_worker))
            sticky = raw is not None and bool(json.loads(raw).get("sticky"))
        except Exception:  # not a JSON map (an env worker of another kind), or not a string key at all
            sticky = False
        if not sticky:
            return self.keys.env_steps
        stream = self.keys.env_steps_of(env_worker)
        if stream not in self._routed:
            await self.broker.ensure_group(stream, "env")
            self._routed.add(stream)
        return stream

    async def observe(self, req: StepRequest, env_worker: str = "") -> Observation:
        """Send the step and wait for its observation (EpisodeFailed after env.observation_timeout_s)."""
        key = (req.episode_id, req.turn)
        fut = asyncio.get_running_loop().create_future()
        self.waiting[key] = fut
        try:
            stream = await self._route(env_worker)
            await self.broker.add(stream, encode(req), maxlen=None if stream == self.keys.env_steps else STEPS_MAXLEN)
            timeout = self.cfg.env.observation_timeout_s
            try:
                return await asyncio.wait_for(fut, timeout)
            except asyncio.TimeoutError:
                raise EpisodeFailed(
                    f"no observation for turn {req.turn} within {timeout:g}s "
                    "(env.observation_timeout_s): is an env worker running?"
                ) from None
        finally:
            self.waiting.pop(key, None)


class Lockstep:
    """env.lockstep: a barrier over a generator's live episodes, so every episode's next turn
    starts only once every live episode has its observation (the synchronous turn loop)."""

    def __init__(self) -> None:
        self.members: set[str] = set()
        self.arrived: set[str] = set()
        self.round = 0
        self.cond = asyncio.Condition()

    async def join(self, eid: str) -> None:
        async with self.cond:
            self.members.add(eid)

    async def leave(self, eid: str) -> None:
        async with self.cond:
            self.members.discard(eid)
            self.arrived.discard(eid)
            self._release()

    async def wait(self, eid: str) -> None:
        async with self.cond:
            self.arrived.add(eid)
            mine = self.round
            self._release()
            await self.cond.wait_for(lambda: self.round > mine)

    def _release(self) -> None:
        if self.arrived and self.members <= self.arrived:
            self.round += 1
            self.arrived.clear()
            self.cond.notify_all()
