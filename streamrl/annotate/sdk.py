"""Python SDK for external reward producers: score rollouts in batches, publish annotations.

    # my_judge.py
    from streamrl.annotate.sdk import producer

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
It exits by itself, with one `stopped` line, when its run ends (the `run:end` mark,
streamrl/core/run_end.py) or its broker stays unreachable; SIGTERM stops it within DRAIN_S.
The wire protocol it speaks is docs/protocol.md.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from streamrl.annotate.annotator import Annotator
from streamrl.config.schema import BrokerConfig, RunConfig
from streamrl.core import run_end
from streamrl.core.bounded_tasks import InFlight
from streamrl.core.broker import Broker, Entry
from streamrl.core.calls import CallTimeout
from streamrl.core.errors import ConfigError
from streamrl.core.messages import Rollout
from streamrl.core.worker import BACKGROUND_STOP_S, HEARTBEAT_TTL_S, Sections

BROKER_LOST = (RedisConnectionError, RedisTimeoutError, OSError)
"""Raised by a broker command once the client's own retries (broker.connect_retries) are spent."""
DRAIN_S = 10.0
"""On a stop, batches still running after this long are abandoned (their rollouts stay pending and
are redelivered), so a stop never waits on a scoring call or a broker that hangs."""
FAREWELL_S = 0.5
"""The final heartbeat DEL's budget: a SIGTERM while the broker is gone must not wait out its retries."""


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


def producer(
    key: str,
    *,
    name: str | None = None,
    batch_size: int = ProducerSpec.batch_size,
    concurrency: int = ProducerSpec.concurrency,
    timeout_s: float | None = ProducerSpec.timeout_s,
) -> Callable:
    """Decorator: mark `fn(rollouts: list[Rollout]) -> list[float]` (sync or async) as a producer.
    The defaults are ProducerSpec's (one place)."""

    def wrap(fn: Callable) -> Callable:
        fn.streamrl_producer = ProducerSpec(key, name or key, batch_size, concurrency, timeout_s)
        return fn

    if batch_size < 1 or concurrency < 1:
        raise ConfigError(
            f"producer {key!r}: batch_size and concurrency must be >= 1 (got {batch_size}, {concurrency})"
        )
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


class ProducerWorker(Annotator):
    """One replica of an external producer (an Annotator: heartbeats, pending takeover, dead-letters,
    one annotation per rollout) with up to spec.concurrency batches in flight."""

    role = "producer"

    def __init__(
        self,
        fn: Callable,
        spec: ProducerSpec,
        broker: Broker,
        run: str,
        worker_id: str,
        broker_cfg: BrokerConfig | None = None,
        partitions: int = 1,
    ):
        """`broker_cfg`: the broker section (claim_idle_ms, block_ms); None: its defaults. A producer is
        outside the job, so it has the run's name, the broker section and the job's rollout.partitions,
        not a whole Config."""
        super().__init__(Sections(RunConfig(name=run), broker_cfg or BrokerConfig(), partitions), broker, worker_id)
        self.fn, self.spec = fn, spec
        self.key, self.group = spec.key, spec.name
        self.is_async = inspect.iscoroutinefunction(fn)
        self.batches = InFlight(spec.concurrency, self.consumer, self.keys.rollout_streams[0], spec.name)
        """Batches being scored, each holding its rollout entries."""
        self.heartbeats = True
        self.exit_code = 0
        """1 when it stopped because the broker was lost or refused it, 0 otherwise."""
        self.log = self.consumer.log = self.log.bind(producer=spec.name, key=spec.key)

    def end(self, reason: str, exit_code: int = 0) -> None:
        """Stop for `reason` (the run ended, the broker is gone), shown on the `stopped` line."""
        if not self.stopping.is_set():
            self.exit_code = exit_code
        self.stop(reason)

    async def start(self) -> None:
        await self._check_partitions()
        try:
            for stream in self.keys.rollout_streams:
                await self.broker.ensure_group(stream, self.spec.name)
        except NoPermissionError:
            # A restricted user (`streamrl producer add`) finds its group made by the admin.
            self.log.info("group_create_not_permitted", group=self.spec.name)

    async def _check_partitions(self) -> None:
        """Warn when the job's `rollouts` are not where --partitions puts them: a producer started with
        another rollout.partitions than the job's reads streams nobody writes (or is refused them)."""
        streams, fix = self.keys.rollout_streams, "pass --partitions with the job's rollout.partitions"
        try:
            # The job's trainer and `streamrl producer add` create groups on every partition at once.
            grouped = [bool(await self.broker.group_info(s)) for s in streams]
        except NoPermissionError as exc:
            self.log.warning(
                "rollouts_not_permitted",
                partitions=len(streams),
                error=str(exc),
                fix=f"{fix} (the partitions `streamrl producer add --partitions` granted this user)",
            )
            return
        if not all(grouped):
            self.log.warning(
                "rollouts_not_found",
                partitions=len(streams),
                missing=[s for s, g in zip(streams, grouped) if not g],
                fix=f"{fix}, or start the job (its trainer creates them); until then this producer waits",
            )

    async def _heartbeat_loop(self) -> None:
        key = self.keys.worker(self.role, self.worker_id)
        while not self.closed:
            try:
                await self.broker.set(key, json.dumps(self.heartbeat()), ttl_s=HEARTBEAT_TTL_S)
            except NoPermissionError:
                # Redis 6.2 ACLs cannot grant SET on the heartbeat key alone (docs/protocol.md, Access control).
                self.heartbeats = False
                self.log.info("heartbeat_not_permitted", reason="this broker user may not SET workers:* keys")
                return
            except BROKER_LOST:
                pass  # the read loop reports a lost broker (and ends the producer)
            await asyncio.sleep(HEARTBEAT_TTL_S / 3)

    async def _watch_run_end(self) -> None:
        while not self.closed:
            try:
                info = await run_end.ended(self.broker, self.keys)
            except NoPermissionError:
                self.log.warning(
                    "run_end_not_permitted",
                    fix="this user predates the run:end grant; run "
                    "`streamrl producer add` again to reset it (or stop the producer by hand)",
                )
                return
            except BROKER_LOST:
                info = None  # the read loop reports a lost broker
            if info is not None:
                self.end(run_end.describe(self.cfg.run.name, info))
                return
            await asyncio.sleep(run_end.POLL_S)

    async def run(self) -> None:
        watcher = asyncio.create_task(self._watch_run_end())
        try:
            await super().run()
        finally:
            watcher.cancel()
            await asyncio.wait({watcher}, timeout=BACKGROUND_STOP_S)

    async def _farewell(self) -> None:
        if not self.heartbeats or self.exit_code:  # no heartbeat (6.2), or no broker to delete it on
            return
        try:  # a healthy broker answers in milliseconds; otherwise the key's TTL retires it
            await asyncio.wait_for(self.broker.delete(self.keys.worker(self.role, self.worker_id)), FAREWELL_S)
        except (asyncio.TimeoutError, *BROKER_LOST):
            pass

    async def _take(self) -> tuple[str, list[tuple[Entry, Rollout]]]:
        # Read only when a call may start: unread entries stay for other replicas.
        while not await self.batches.wait_slot(timeout=None):
            pass
        stream = self.consumer.pick(self.keys.rollout_streams)  # a batch is of one partition
        return stream, await self.read(stream, self.spec.name, count=self.spec.batch_size, expect=Rollout)

    async def step(self) -> bool:
        taking = asyncio.ensure_future(self._take())
        stopped = asyncio.ensure_future(self.stopping.wait())
        await asyncio.wait({taking, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not taking.done():
            # Stopped while waiting for a free slot or for the broker: whatever the cancelled read was
            # delivered stays pending on this consumer and is redelivered (XAUTOCLAIM), never lost.
            taking.cancel()
            await asyncio.gather(taking, return_exceptions=True)
            return False
        try:
            stream, items = taking.result()
        except BROKER_LOST as exc:
            self.end(f"broker unreachable ({exc}): the run is over or the broker is down", exit_code=1)
            return False
        except NoPermissionError as exc:
            self.end(
                f"the broker refused this user ({exc}); create it with `streamrl producer add`, with "
                f"--partitions {self.keys.partitions} if that is the job's rollout.partitions (else run this "
                "producer with the job's)",
                exit_code=1,
            )
            return False
        if not items:
            return False
        self.batches.start(self._handle(items, stream), hold=[entry.id for entry, _ in items], stream=stream)
        return True

    async def _call(self, rollouts: list[Rollout]) -> list:
        if self.is_async:
            values = await asyncio.wait_for(self.fn(rollouts), self.spec.timeout_s)
        else:  # on a call thread that a hung call does not keep (streamrl/core/calls.py, Calls)
            values = await self.calls.run(self.fn, rollouts, timeout=self.spec.timeout_s)
        values = list(values)
        if len(values) != len(rollouts):
            raise ValueError(f"returned {len(values)} scores for {len(rollouts)} rollouts")
        return values

    async def annotate(self, rollouts: list[Rollout]) -> list[tuple]:
        try:
            values, failure = await self._call(rollouts), ""
        except (asyncio.TimeoutError, CallTimeout):
            values, failure = [None] * len(rollouts), f"timed out after {self.spec.timeout_s}s"
        except Exception as exc:  # user code: a failure of this batch, not of the producer
            values, failure = [None] * len(rollouts), f"{type(exc).__name__}: {exc}"
        return [_check(value, failure) for value in values]

    def dead_letter_reason(self, error: str) -> str:
        self.count("errors")
        return f"producer {self.spec.name}: {error}"

    async def _handle(self, items: list[tuple[Entry, Rollout]], stream: str) -> None:
        try:
            await self.publish(items, await self.annotate([r for _, r in items]), stream)
        except Exception as exc:  # broker trouble: leave the entries pending; XAUTOCLAIM retries them
            self.log.error("batch_failed", error=str(exc), rollouts=len(items))

    async def close(self) -> None:
        try:
            await self._drain()
        finally:
            self.calls.close()

    async def _drain(self) -> None:
        # Drain: finish the batches already taken, so they are acked, not redelivered; but not on a
        # broker that is gone, and not past DRAIN_S.
        late = await self.batches.drain(timeout=0 if self.exit_code else DRAIN_S)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        if late and not self.exit_code:
            self.log.warning(
                "batches_abandoned",
                batches=len(late),
                drain_s=DRAIN_S,
                reason="still running at the stop; their rollouts stay pending and are redelivered",
            )


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
