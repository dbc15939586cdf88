"""Python SDK for external reward producers: score rollouts in batches, publish annotations.

    # my_judge.py
    from streamrl.sdk import producer

    @producer(key="judge", batch_size=16, concurrency=4)
    async def judge(rollouts):              # a plain `def` works too (it runs in a thread)
        return [len(r.text) / 16 for r in rollouts]

    streamrl reward --fn my_judge:judge --run tiny --broker redis://judge:PW@host:6379/0

A producer reads `rollouts` with its own consumer group (the producer's name; every producer
sees every rollout, its replicas share the load), calls the function on decoded `Rollout`s in
batches of up to `batch_size` with at most `concurrency` batches in flight, writes one
`Annotation(key=...)` per rollout to `annotations` and then acks. A function that raises, times
out, or returns a non-finite value yields annotations with `error` set (the assembler applies
the key's on_timeout policy) and a dead-letter record; undecodable entries are dead-lettered.
The wire protocol it speaks is docs/protocol.md.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np
from redis.exceptions import NoPermissionError

from streamrl.broker import Broker, Entry
from streamrl.config import BrokerConfig, Config, RunConfig
from streamrl.errors import ConfigError
from streamrl.messages import Annotation, Rollout, encode
from streamrl.worker import HEARTBEAT_TTL_S, Worker


@dataclass(frozen=True)
class ProducerSpec:
    key: str
    """Annotation key written for each rollout (list it in annotations.external)."""
    name: str
    """Consumer group on `rollouts`; replicas with the same name share the work."""
    batch_size: int = 16
    """Rollouts per call of the function (fewer when fewer are waiting)."""
    concurrency: int = 4
    """Calls in flight at once."""
    timeout_s: float | None = None
    """A call taking longer fails its batch (error annotations). None: no limit."""


def producer(key: str, *, name: str | None = None, batch_size: int = 16, concurrency: int = 4,
             timeout_s: float | None = None) -> Callable:
    """Decorator: mark `fn(rollouts: list[Rollout]) -> list[float]` (sync or async) as a producer."""
    def wrap(fn: Callable) -> Callable:
        fn.streamrl_producer = ProducerSpec(key, name or key, batch_size, concurrency, timeout_s)
        return fn
    if batch_size < 1 or concurrency < 1:
        raise ConfigError(f"producer {key!r}: batch_size and concurrency must be >= 1 (got {batch_size}, {concurrency})")
    return wrap


def spec_of(fn: Callable, **overrides: Any) -> ProducerSpec:
    """The function's @producer spec with non-None `overrides` applied; `key` is needed without one."""
    spec = getattr(fn, "streamrl_producer", None)
    given = {k: v for k, v in overrides.items() if v is not None}
    if spec is None:
        if "key" not in given:
            raise ConfigError(f"{getattr(fn, '__name__', fn)} has no @producer(key=...); pass --key KEY")
        given.setdefault("name", given["key"])
        return ProducerSpec(**given)
    return replace(spec, **given)


class ProducerWorker(Worker):
    """One replica of an external producer (a Worker: heartbeats, pending takeover, dead-letters)."""

    role = "producer"

    def __init__(self, fn: Callable, spec: ProducerSpec, broker: Broker, run: str, worker_id: str,
                 claim_idle_ms: int = 30_000, block_ms: int = 200):
        cfg = Config(run=RunConfig(name=run), broker=BrokerConfig(claim_idle_ms=claim_idle_ms, block_ms=block_ms))
        super().__init__(cfg, broker, worker_id)
        self.fn, self.spec = fn, spec
        self.is_async = inspect.iscoroutinefunction(fn)
        self.slots = asyncio.Semaphore(spec.concurrency)
        self.tasks: set[asyncio.Task] = set()
        self.heartbeats = True
        self.log = self.log.bind(producer=spec.name, key=spec.key)

    async def start(self) -> None:
        try:
            await self.broker.ensure_group(self.keys.rollouts, self.spec.name)
        except NoPermissionError:
            # A restricted user (`streamrl producer add`) finds its group made by the admin.
            self.log.info("group_create_not_permitted", group=self.spec.name)

    async def _heartbeat_loop(self) -> None:
        try:
            await self.broker.set(self.keys.worker(self.role, self.worker_id), "{}", ttl_s=HEARTBEAT_TTL_S)
        except NoPermissionError:
            # Redis 6.2 ACLs cannot grant SET on the heartbeat key alone (docs/protocol.md, Security).
            self.heartbeats = False
            self.log.info("heartbeat_not_permitted", reason="this broker user may not SET workers:* keys")
            return
        await super()._heartbeat_loop()

    async def run(self) -> None:
        try:
            await super().run()
        except NoPermissionError:
            if self.heartbeats:  # only the final heartbeat DEL of a restricted user is expected to fail
                raise

    async def step(self) -> bool:
        await self.slots.acquire()  # read only when a call may start: unread entries stay for other replicas
        try:
            items = await self.read(self.keys.rollouts, self.spec.name, count=self.spec.batch_size, expect=Rollout)
        except BaseException:
            self.slots.release()
            raise
        if not items:
            self.slots.release()
            return False
        for entry, _ in items:
            self.hold(self.keys.rollouts, self.spec.name, entry.id)
        task = asyncio.create_task(self._handle(items))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return True

    async def _call(self, rollouts: list[Rollout]) -> list:
        call = self.fn(rollouts) if self.is_async else asyncio.to_thread(self.fn, rollouts)
        values = await asyncio.wait_for(call, self.spec.timeout_s)
        values = list(values)
        if len(values) != len(rollouts):
            raise ValueError(f"returned {len(values)} scores for {len(rollouts)} rollouts")
        return values

    async def _handle(self, items: list[tuple[Entry, Rollout]]) -> None:
        try:
            rollouts = [r for _, r in items]
            try:
                values, failure = await self._call(rollouts), ""
            except asyncio.TimeoutError:
                values, failure = [None] * len(items), f"timed out after {self.spec.timeout_s}s"
            except Exception as exc:  # user code: a failure of this batch, not of the producer
                values, failure = [None] * len(items), f"{type(exc).__name__}: {exc}"
            out = []
            for (entry, r), value in zip(items, values):
                value, error = _check(value, failure)
                if error:
                    await self.dead_letter(self.keys.rollouts, entry, f"producer {self.spec.name}: {error}")
                    self.count("errors")
                out.append(encode(Annotation(rollout_id=r.rollout_id, key=self.spec.key, value=value,
                                             producer=self.worker_id, error=error)))
            await self.broker.add_many(self.keys.annotations, out)
            await self.broker.ack(self.keys.rollouts, self.spec.name, [e.id for e, _ in items])
            self.count("scored", len(items))
        except Exception as exc:  # broker trouble: leave the entries pending; XAUTOCLAIM retries them
            self.log.error("batch_failed", error=str(exc), rollouts=len(items))
        finally:
            for entry, _ in items:
                self.release(self.keys.rollouts, self.spec.name, entry.id)
            self.slots.release()

    async def close(self) -> None:
        if self.tasks:  # drain: finish the batches already taken, so they are acked, not redelivered
            await asyncio.gather(*list(self.tasks), return_exceptions=True)


def _check(value: Any, failure: str) -> tuple[Any, str]:
    """(annotation value, error): one finite number in float32 range, else 0.0 with the reason.

    An external key is a scalar (docs/protocol.md, "Annotation keys"): a vector would be
    dead-lettered by the trainer, so it is reported here, where the function's author sees it."""
    if failure:
        return 0.0, failure
    if isinstance(value, (np.ndarray, list, tuple)) and np.size(value) != 1:
        return 0.0, f"returned {np.size(value)} values for one rollout; an external key takes one number"
    try:
        number = float(np.asarray(value).item()) if isinstance(value, (np.ndarray, list, tuple)) else float(value)
    except (TypeError, ValueError):
        return 0.0, f"returned {value!r}, not a number"
    if not math.isfinite(number) or abs(number) > float(np.finfo(np.float32).max):
        return 0.0, f"returned {number}"
    return number, ""


def serve_producer(fn: Callable, spec: ProducerSpec, broker_url: str, run: str, worker_id: str,
                   claim_idle_ms: int = 30_000) -> None:
    """Run one producer replica until SIGINT/SIGTERM (then drain in-flight batches and exit)."""
    from streamrl.runtime import serve

    serve(lambda broker: ProducerWorker(fn, spec, broker, run, worker_id, claim_idle_ms=claim_idle_ms), broker_url)
