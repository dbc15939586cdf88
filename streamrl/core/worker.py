"""The lifecycle every role shares: start / run / stop(grace), heartbeats, keepalive of held entries.

A role subclasses `Worker`, sets `role`, and implements `step()` (one unit of work; return
False when idle). `run()` loops until `stop()` is called (SIGINT/SIGTERM) or `done` is set.
Heartbeats and the `stopped` log line carry `busy_fraction`: the share of the loop's time spent in
steps that did work (what `streamrl report` plots per role). Reading a stream (the consumer-group
protocol, decoding, dead-letters) is the worker's `consumer` (streamrl/core/consumer.py).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import structlog

from streamrl.config.schema import BrokerConfig, Config, RunConfig
from streamrl.core.broker import Broker, Entry, Keys
from streamrl.core.consumer import StreamConsumer
from streamrl.core.errors import NOT_TRANSIENT, FatalError

HEARTBEAT_TTL_S = 15.0
BACKGROUND_STOP_S = 2.0
"""How long the stop waits for the heartbeat and keepalive tasks to end after cancelling them."""
FAREWELL_S = 5.0
"""How long the final heartbeat DEL may take: on a broker that is gone it would retry for a minute."""


@dataclass(frozen=True)
class Sections:
    """The two sections the Worker base reads (the run's name, the broker's timings). A role of a job
    passes its whole Config, which has both; a worker outside a job (an SDK producer) passes these."""

    run: RunConfig
    broker: BrokerConfig
    partitions: int = 1
    """The job's rollout.partitions (streamrl.core.broker.Keys)."""


class Worker:
    role: str = "worker"
    measures_busy: bool = True
    """Report the share of loop time in steps that returned True as `busy_fraction`. A role whose step
    also waits for its input (the trainer waits for a batch) sets False and reports its own (metrics);
    a role that sets stats["busy_fraction"] itself (the generator: time with sequences in flight) wins."""

    def __init__(self, cfg: Config | Sections, broker: Broker, worker_id: str, run_dir: Path | None = None):
        self.cfg = cfg
        self.broker = broker
        self.worker_id = worker_id
        self.run_dir = Path(run_dir) if run_dir else None
        self.keys = Keys.of(cfg, broker)
        self.log = structlog.get_logger("streamrl").bind(role=self.role, worker_id=worker_id, run=cfg.run.name)
        self.stopping = asyncio.Event()
        self.done = False
        self.closed = False
        """Set when the loop has ended: background loops end at their next turn even if a cancel was lost."""
        self.stop_reason = ""
        """Why the loop ended (a signal, the run's end), shown on the `stopped` line."""
        self.stats: dict[str, float] = {}
        self._started = time.time()
        self.consumer = StreamConsumer(broker, cfg.broker, worker_id, self.keys, self.log, self.count)
        """This worker's reads of its input streams (consumer name: worker_id)."""
        self._loop_started: float | None = None
        self._step_busy_s = 0.0

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Create consumer groups and load what the role needs before the loop."""

    async def step(self) -> bool:
        """One unit of work. Return True if something was done (False: idle)."""
        raise NotImplementedError

    async def close(self) -> None:
        """Release resources (engines, files). Called once after the loop ends."""

    def stop(self, reason: str = "") -> None:
        """Ask the loop to finish its current step and exit; `reason` goes on the `stopped` line."""
        self.stop_reason = self.stop_reason or reason
        self.stopping.set()

    def stop_budget_s(self) -> float:
        """How long a clean stop may take before it is reported as slow (with what it waits on)."""
        return 20.0

    async def run(self) -> None:
        try:
            await self.start()
        except NOT_TRANSIENT as exc:
            raise startup_failure(self.role, exc) from exc
        freeze_startup_heap()
        background = [asyncio.create_task(self._heartbeat_loop()), asyncio.create_task(self._keepalive_loop())]
        self.log.info("started", pid=os.getpid())
        self._loop_started = time.monotonic()
        try:
            while not self.stopping.is_set() and not self.done:
                t0 = time.monotonic()
                if await self.step():
                    self._step_busy_s += time.monotonic() - t0
        finally:
            try:
                # Heartbeat and keepalive run on while close() drains: entries still being finished
                # must not look idle (another worker would claim and redo them) and the worker is alive.
                await self.close()
            finally:
                self.closed = True
                for task in background:
                    task.cancel()
                # A cancellation can be lost inside a library call (seen: a generator's heartbeat SET
                # right after its start kept the stop waiting until the supervisor killed it).
                _, stuck = await asyncio.wait(background, timeout=BACKGROUND_STOP_S)
                if stuck:
                    from streamrl.core.stacks import task_stacks

                    self.log.warning("background_tasks_left", count=len(stuck), tasks=task_stacks())
                await self._farewell()
            reason = {"reason": self.stop_reason} if self.stop_reason else {}
            self.log.info(
                "stopped", **reason, uptime_s=round(time.time() - self._started, 1), **{**self.busy(), **self.stats}
            )

    async def _farewell(self) -> None:
        """Delete the heartbeat key; where that fails the key's TTL retires it, so say so and go on."""
        try:
            await asyncio.wait_for(self.broker.delete(self.keys.worker(self.role, self.worker_id)), FAREWELL_S)
        except Exception as exc:
            self.log.warning(
                "heartbeat_not_deleted", error=str(exc) or type(exc).__name__, expires_in_s=HEARTBEAT_TTL_S
            )

    # -- helpers ---------------------------------------------------------------------------
    def busy(self) -> dict[str, float]:
        """{"busy_fraction": share of the loop's time in steps that did work}; {} before the loop or opted out."""
        if not self.measures_busy or self._loop_started is None:
            return {}
        elapsed = max(time.monotonic() - self._loop_started, 1e-9)
        return {"busy_fraction": round(min(self._step_busy_s / elapsed, 1.0), 4)}

    def count(self, name: str, by: float = 1) -> None:
        self.stats[name] = self.stats.get(name, 0) + by

    async def _heartbeat_loop(self) -> None:
        key = self.keys.worker(self.role, self.worker_id)
        while not self.closed:
            try:
                await self.broker.set(key, json.dumps(self.heartbeat()), ttl_s=HEARTBEAT_TTL_S)
            except Exception as exc:  # a broker hiccup must not kill the worker
                self.log.warning("heartbeat_failed", error=str(exc))
            await asyncio.sleep(HEARTBEAT_TTL_S / 3)

    def heartbeat(self) -> dict:
        """The heartbeat key's JSON (docs/protocol.md, "Other keys")."""
        return {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "ts": time.time(),
            "uptime_s": round(time.time() - self._started, 1),
            **self.busy(),
            **self.stats,
        }

    def hold(self, stream: str, group: str, entry_id: str) -> None:
        """Mark an entry as in progress: its idle time is reset periodically until `release`."""
        self.consumer.hold(stream, group, entry_id)

    def release(self, stream: str, group: str, entry_id: str) -> None:
        self.consumer.release(stream, group, entry_id)

    async def _keepalive_loop(self) -> None:
        period = self.cfg.broker.claim_idle_ms / 3000
        while not self.closed:
            await asyncio.sleep(period)
            await self.consumer.touch_held()

    async def dead_letter(self, stream: str, entry: Entry, reason: str) -> None:
        """Move a bad entry to the dead-letter stream with the reason (the caller acks it)."""
        await self.consumer.dead_letter(stream, entry, reason)

    async def decode_entries(
        self, stream: str, group: str, entries: list[Entry], expect: type | None = None
    ) -> list[tuple[Entry, Any]]:
        """Decode entries; bad ones (or not of type `expect`) are dead-lettered and acked."""
        return await self.consumer.decode_entries(stream, group, entries, expect)

    async def read(
        self,
        stream: str,
        group: str,
        count: int,
        expect: type | None = None,
        claim: bool = True,
        on_bad: Callable[[Entry, str], None] | None = None,
    ) -> list[tuple[Entry, Any]]:
        """The next entries of `stream` for this worker (StreamConsumer.read: own pending, idle, new)."""
        return await self.consumer.read(stream, group, count, expect, claim, on_bad)

    @property
    def caught_up(self) -> dict[str, bool]:
        return self.consumer.caught_up


Serve = Callable[[Callable[[Broker], Worker]], None]
"""`serve(factory)`: connect to the job's broker, build the Worker with `factory(broker)` and run it until it
ends or is signalled. The launcher (streamrl/launch/runtime.py) serves a role's Worker class itself and
hands this to a role that starts its own processes first (the trainer's ranks: rank 0 serves its worker)."""


def freeze_startup_heap() -> None:
    """Move everything alive after start-up (modules, torch, a model, the config) out of the cyclic
    garbage collector's reach: its full collections otherwise walk all of them again and again while
    the loop allocates messages (the trainer's intake; measured in docs/performance.md, "Message path").
    Start-up's own garbage is collected first, so nothing collectable is frozen; what start-up keeps
    (engines, models, tables) lives as long as the worker, so freezing it loses nothing."""
    gc.collect()
    gc.freeze()


def startup_failure(role: str, exc: BaseException) -> FatalError:
    """The FatalError for a non-transient error raised while `role` starts (its message names the fix)."""
    hint = {
        ImportError: "install the missing package (or fix the module) in this environment",
        FileNotFoundError: "create the file or fix the path in the config",
    }
    fix = next((h for t, h in hint.items() if isinstance(exc, t)), "")
    return FatalError(
        f"{role} could not start: {type(exc).__name__}: {exc}"
        + (f"; {fix}" if fix else "")
        + " (not restarted: a restart would fail the same way)"
    )
