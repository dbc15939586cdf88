"""Simulated generator and trainer roles for `streamrl bench pipeline`: the real protocol, no model.

    SimGenerator(cfg, broker, "generator-0", token_s=0.008, tokens=64)   # vLLM stand-in
    SimTrainer(cfg, broker, "trainer-0", run_dir, train_s=0.5, steps=20) # FSDP stand-in

Everything around them is the real engine: the feeder's admission rule (workers/feeder.py), the
broker and its streams, the reward worker, the Assembler's join and staleness filter. The
generator takes prompt groups from `prompts` (consumer group "generator", at most
generator.max_inflight_groups at once), waits for weights at least as new as each group's
admission version, "decodes" `tokens` steps of `token_s` seconds (every in-flight sequence
advances together, as in a batched engine, so a full wave of groups takes tokens * token_s),
records a version switch when the trainer's version moves mid-sequence, and publishes each
group's rollouts. The trainer takes the Assembler's batches, sleeps `train_s` per step, bumps
`trainer:version` (the generator's "new weights"), acks, and writes metrics.jsonl rows with
workers/trainer.py's row function (streamrl/train/metrics.py, step_row). Both sleep rather than
burn CPU, so the bench measures the engine's scheduling, not the machine's spare cores.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import numpy as np

from streamrl.config.schema import Config
from streamrl.core.bounded_tasks import InFlight
from streamrl.core.messages import Prompt, Rollout, encode, new_rollout_id
from streamrl.core.worker import Worker
from streamrl.train.metrics import MetricsWriter, step_row

CHUNK_TOKENS = 8
"""Tokens decoded between checks of the weights version (a switch lands at a chunk boundary)."""


class Busy:
    """Time intervals during which a role had work in progress (for busy fractions over any window)."""

    def __init__(self) -> None:
        self.active = 0
        self.since = 0.0
        self.intervals: list[tuple[float, float]] = []

    def add(self, delta: int) -> None:
        now = time.time()
        if self.active == 0 and delta > 0:
            self.since = now
        self.active += delta
        if self.active == 0:
            self.intervals.append((self.since, now))

    def all(self) -> list[tuple[float, float]]:
        """The intervals, the one still open (work in progress) closed at now."""
        return self.intervals + ([(self.since, time.time())] if self.active > 0 else [])

    async def dump_every(self, path: Path, period_s: float = 0.05) -> None:
        """Keep `path` (JSON) current, so the bench reads the intervals however the process ends."""
        while True:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.all()))
            tmp.replace(path)
            await asyncio.sleep(period_s)


def busy_fraction(intervals: list[tuple[float, float]], t0: float, t1: float) -> float:
    """Share of [t0, t1] covered by the (non-overlapping) intervals."""
    covered = sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in intervals)
    return covered / max(t1 - t0, 1e-9)


def _dump_busy(worker: Worker) -> asyncio.Task | None:
    """RUN_DIR/busy-<role>.json, rewritten as it changes (none without a run directory)."""
    if worker.run_dir is None:
        return None
    return asyncio.create_task(worker.work_log.dump_every(worker.run_dir / f"busy-{worker.role}.json"))


class SimGenerator(Worker):
    role = "generator"

    def __init__(self, cfg: Config, broker, worker_id: str, token_s: float, tokens: int, run_dir: Path | None = None):
        super().__init__(cfg, broker, worker_id, run_dir)
        self.token_s, self.tokens = token_s, tokens
        self.version = 0
        self.work_log = Busy()  # not `busy`: Worker.busy() reports the busy fraction on the stopped line
        self._dumper: asyncio.Task | None = None
        self.groups = InFlight(cfg.generator.max_inflight_groups)
        """Tracked, not held: the simulation keeps no prompt's idle time fresh."""
        self._version_changed = asyncio.Event()

    async def start(self) -> None:
        await self.broker.ensure_group(self.keys.prompts, "generator")
        self._watcher = asyncio.create_task(self._watch_version())
        self._dumper = _dump_busy(self)

    async def _watch_version(self) -> None:
        """The weight-store poll of workers/generator.py: here, the trainer's version key."""
        while True:
            v = int(await self.broker.get(self.keys.trainer_version) or 0)
            if v > self.version:
                self.version = v
                self._version_changed.set()
                self._version_changed = asyncio.Event()
            await asyncio.sleep(self.cfg.generator.weights_poll_s)

    async def step(self) -> bool:
        if not await self.groups.wait_slot(timeout=self.cfg.broker.block_ms / 1000):
            return False
        items = await self.read(self.keys.prompts, "generator", count=self.groups.free(), expect=Prompt)
        for entry, prompt in items:
            if entry.id not in self.groups:
                self.groups.start(self._group(entry.id, prompt), hold=[entry.id])
        return bool(items)

    async def _group(self, entry_id: str, p: Prompt) -> None:
        while self.version < p.admitted_version:  # as workers/generator.py: never older weights than admitted
            await self._version_changed.wait()
        first, switches = self.version, []
        self.work_log.add(+1)
        try:
            for done in range(0, self.tokens, CHUNK_TOKENS):
                if self.version != (switches[-1][1] if switches else first):
                    switches.append([done, self.version])
                await asyncio.sleep(self.token_s * min(CHUNK_TOKENS, self.tokens - done))
        finally:
            self.work_log.add(-1)
        ids = np.arange(self.tokens, dtype=np.int32) % 50
        blobs = [
            encode(
                Rollout(
                    rollout_id=new_rollout_id(p.group_id, s),
                    group_id=p.group_id,
                    sample=s,
                    group_size=p.group_size,
                    prompt_ids=p.prompt_ids,
                    completion_ids=ids,
                    logprobs=np.full(self.tokens, -1.0, np.float32),
                    version=first,
                    version_switches=switches,
                    text="a" * self.tokens,
                    prompt_text=p.text,
                    meta=p.meta,
                    worker=self.worker_id,
                    finished_at=time.time(),
                )
            )
            for s in range(p.group_size)
        ]
        await self.broker.add_many(self.keys.rollouts, blobs)
        await self.broker.ack(self.keys.prompts, "generator", [entry_id])

    async def close(self) -> None:
        for task in [self._watcher, self._dumper, *self.groups.tasks]:
            if task is not None:
                task.cancel()
        await asyncio.gather(self._watcher, *self.groups.tasks, return_exceptions=True)


class SimTrainer(Worker):
    role = "trainer"

    def __init__(
        self, cfg: Config, broker, worker_id: str, run_dir: Path | None, train_s: float, steps: int | None = None
    ):
        super().__init__(cfg, broker, worker_id, run_dir)
        self.train_s = train_s
        self.steps = steps or cfg.trainer.steps
        self.metrics = MetricsWriter(run_dir)
        self.work_log = Busy()  # not `busy`: Worker.busy() reports the busy fraction on the stopped line
        self._dumper: asyncio.Task | None = None

    async def start(self) -> None:
        from streamrl.assemble.assembler import Assembler

        self.assembler = Assembler(self.cfg, self.broker, self.log, self.count, consumer=self.worker_id)
        await self.assembler.start()
        self.assembler.start_intake()  # as workers/trainer.py: intake goes on during the train step
        self.version = 0
        await self.broker.set(self.keys.trainer_version, 0)
        self.t_start = time.time()
        self._dumper = _dump_busy(self)

    async def step(self) -> bool:
        if self.version >= self.steps:
            self.done = True
            return False
        batch = await self.assembler.next_batch(self.version, stop=self.stopping.is_set)
        if batch is None:
            return False
        t0 = time.time()
        self.work_log.add(+1)
        await asyncio.sleep(self.train_s)
        self.work_log.add(-1)
        t1 = time.time()
        self.version += 1
        await self.broker.set(self.keys.trainer_version, self.version)
        await self.assembler.commit(batch)
        # the trainer's row (streamrl/train/metrics.py), and `ts`: the bench measures throughput between rows
        self.metrics.write({**step_row(batch, self.version, t1 - self.t_start, t1 - t0), "ts": t1})
        return True

    async def close(self) -> None:
        await self.assembler.stop_intake()
        if self._dumper is not None:
            self._dumper.cancel()
            (self.run_dir / f"busy-{self.role}.json").write_text(json.dumps(self.work_log.all()))
        self.metrics.close()
