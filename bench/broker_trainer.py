"""The trainer stage of `streamrl bench broker` (bench/broker.py): the real Assembler with the broker
traffic of workers/trainer.py, minus the training."""

from __future__ import annotations

import asyncio
import json
import time

from streamrl.config.schema import Config
from streamrl.core import accounting
from streamrl.core.trimming import trim_periodically
from streamrl.core.worker import Worker


class BenchTrainer(Worker):
    """The trainer role minus training, with workers/trainer.py's broker traffic: the real Assembler's
    intake in a background task; per step the write-ahead step log, the version and a metrics line;
    the acks only at a checkpoint (every trainer.checkpoint_every steps, and at the end; the bench
    writes none); the streams trimmed in the background."""

    role = "trainer"

    def __init__(self, cfg: Config, broker, total: int, report):
        super().__init__(cfg, broker, "trainer-0")
        self.total, self.report = total, report
        self.joined: list[float] = []
        self.batched: list[float] = []
        self.first = float("inf")
        self.trims: list[int] = []
        self.version = 0
        self.unacked: list = []
        self.ack_rounds = 0

    async def start(self) -> None:
        from streamrl.assemble.assembler import Assembler

        self.assembler = Assembler(self.cfg, self.broker, self.log, self.count, consumer=self.worker_id)
        await self.assembler.start()
        self.cpu0 = time.process_time()  # the run's CPU, not the start-up's (torch's import: ~1 s)
        self.assembler.start_intake()
        self._trimmer = asyncio.create_task(trim_periodically(self.broker, self.cfg, self.trims.append, self.log))

    async def close(self) -> None:
        if hasattr(self, "assembler"):
            await self.assembler.stop_intake()
        if hasattr(self, "_trimmer"):
            self._trimmer.cancel()

    async def step(self) -> bool:
        # Version 0: the bench's generator never loads new weights, so its rollouts never go stale.
        batch = await self.assembler.next_batch(0, stop=self.stopping.is_set)
        if batch is None:
            return False
        now = time.time()
        done_at = {gid: self.assembler.groups[gid].completed_at for gid in batch.group_ids}
        for r in batch.rollouts:
            self.joined.append(done_at[r.group_id] - r.finished_at)
            self.batched.append(now - r.finished_at)
            self.first = min(self.first, r.finished_at)
        await accounting.log_step(
            self.broker, self.keys, self.version + 1, batch.group_ids, [r.rollout_id for r in batch.rollouts]
        )
        self.version += 1
        await self.broker.set(self.keys.trainer_version, self.version)  # the generator's window moves on
        self.unacked.append(batch)
        line = json.dumps({"step": self.version, "samples": len(batch), **batch.stats})
        await self.broker.add(self.keys.metrics, line.encode(), maxlen=10_000)
        finished = len(self.batched) >= self.total
        if finished or self.version % self.cfg.trainer.checkpoint_every == 0:
            for done in self.unacked:  # workers/trainer.py's _after_save without a run directory
                await self.assembler.commit(done)
            self.unacked, self.ack_rounds = [], self.ack_rounds + 1
        if finished:
            self.done = True
            self.report.put(
                (
                    "trainer",
                    {
                        "n": len(self.batched),
                        "first": self.first,
                        "last": time.time(),
                        "joined": self.joined,
                        "batched": self.batched,
                        "counters": dict(self.assembler.counters),
                        "trimmed": self.trims,
                        "steps": self.version,
                        "ack_rounds": self.ack_rounds,
                        "cpu_s": time.process_time() - self.cpu0,
                    },
                )
            )
        return True
