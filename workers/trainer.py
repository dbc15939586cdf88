"""Trainer role: assemble staleness-bounded batches, train with FSDP2 ranks, publish versioned weights.

    streamrl worker trainer --config configs/tiny-cpu.yaml --broker redis://... --run tiny

Launches cfg.trainer.world_size torch.distributed ranks (or joins torchrun's). Rank 0 owns the
broker side: the assembler, the weight store and metrics; every rank runs the same train step on
its shard. After each step the version v+1 is snapshot on rank 0 and published in the
background, so the loop's only publishing cost is the snapshot copy.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
import torch.distributed as dist

from streamrl.config import Config
from streamrl.messages import Control, encode
from streamrl.metrics import MetricsWriter
from streamrl.staleness import staleness_histogram
from streamrl.weights import make_weight_store
from streamrl.worker import Worker
from workers.assembler import Assembler
from workers.dist import launch
from workers.train_engine import TrainEngine


def _bcast(obj):
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class TrainerWorker(Worker):
    role = "trainer"

    def __init__(self, cfg: Config, broker, worker_id: str, run_dir: Path | None, engine: TrainEngine):
        super().__init__(cfg, broker, worker_id, run_dir)
        self.engine = engine
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="train")
        self.metrics = MetricsWriter(run_dir, cfg)
        self.publishing: asyncio.Task | None = None
        self.train_intervals: list[tuple[float, float]] = []

    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def start(self) -> None:
        self.assembler = Assembler(self.cfg, self.broker, self, consumer=self.worker_id)
        await self.assembler.start()
        self.store = make_weight_store(self.cfg, self.broker, self.run_dir)
        self.version = int(await self.broker.get(self.keys.trainer_version) or 0)
        await self.broker.set(self.keys.trainer_version, self.version)
        self.t_start = time.time()
        self.log.info("trainer_ready", policy_version=self.version, steps=self.cfg.trainer.steps,
                      world_size=self.engine.world_size)

    def _overlap(self, rollouts) -> int:
        """Rollouts that finished while the trainer was busy training: generation overlapped training."""
        return sum(1 for r in rollouts for a, b in self.train_intervals if a <= r.finished_at <= b)

    async def step(self) -> bool:
        if self.version >= self.cfg.trainer.steps:
            self.done = True
            return False
        batch = await self.assembler.next_batch(self.version, stop=self.stopping.is_set)
        if batch is None:
            return False
        t0 = time.time()
        await self._call(_bcast, batch)
        m = await self._call(self.engine.train_step, batch)
        t1 = time.time()
        state = await self._call(self.engine.full_state_dict)
        t2 = time.time()
        self.version += 1
        if self.publishing is not None:
            await self.publishing  # one publish in flight at a time
        self.publishing = asyncio.create_task(self.store.publish(self.version, state))
        await self.broker.set(self.keys.trainer_version, self.version)
        await self.assembler.commit(batch)
        overlap = self._overlap(batch.rollouts)
        self.train_intervals = (self.train_intervals + [(t0, t1)])[-8:]
        self._record(batch, m, overlap, train_s=t1 - t0, stall_s=t2 - t1)
        return True

    def _record(self, batch, m: dict, overlap: int, train_s: float, stall_s: float) -> None:
        tokens = [len(r.completion_ids) for r in batch.rollouts]
        engine = {("engine_time_s" if k == "time_s" else k): v for k, v in m.items() if k not in ("tokens", "seqs")}
        rec = {
            "step": self.version, "policy_version": self.version,
            "reward_mean": float(np.mean(batch.rewards)), "reward_std": float(np.std(batch.rewards)),
            "samples": len(batch), "tokens": int(sum(tokens)),
            "staleness_max": int(batch.staleness.max()), "staleness_mean": float(batch.staleness.mean()),
            "staleness_hist": staleness_histogram(batch.staleness),
            "staleness_hist_tokens": staleness_histogram(batch.staleness, tokens),
            "time_s": round(time.time() - self.t_start, 3), "wait_s": round(batch.stats.get("wait_s", 0.0), 4),
            "train_s": round(train_s, 4), "publish_stall_s": round(stall_s, 4),
            "overlap_rollouts": overlap, "overlap_frac": overlap / max(1, len(batch)),
            "completion_len_mean": float(np.mean(tokens)),
            "reward_components": {k: float(np.mean(v)) for k, v in batch.reward_components.items()},
            **{k: v for k, v in batch.stats.items() if k != "wait_s"},
            **engine,
        }
        line = self.metrics.write(rec)
        asyncio.get_running_loop().create_task(self.broker.add(self.keys.metrics, line.encode(), maxlen=10_000))
        self.log.info("step", step=self.version, reward=round(rec["reward_mean"], 3),
                      staleness_max=rec["staleness_max"], wait_s=rec["wait_s"], train_s=rec["train_s"])

    async def close(self) -> None:
        if self.publishing is not None:
            await self.publishing
        await self._call(_bcast, None)  # releases the follower ranks
        if self.done:
            await self.broker.add(self.keys.control, encode(Control(action="stop", version=self.version,
                                                                    reason="trainer finished")))
        self.metrics.close()
        self.pool.shutdown(wait=True)


def _follow(engine: TrainEngine) -> None:
    """Ranks > 0: train on each broadcast batch until rank 0 sends None."""
    while (batch := _bcast(None)) is not None:
        engine.train_step(batch)
        engine.full_state_dict()


def _rank_main(cfg: Config, broker_url: str, worker_id: str, run_dir: Path | None, rank: int, world: int) -> None:
    from streamrl.runtime import serve

    engine = TrainEngine(cfg, cfg.model.path, rank, world)
    if rank == 0:
        serve(lambda broker: TrainerWorker(cfg, broker, worker_id, run_dir, engine), broker_url)
    else:
        _follow(engine)


def main(cfg: Config, broker_url: str, worker_id: str, run_dir: Path | None) -> None:
    launch(cfg.trainer.world_size, partial(_rank_main, cfg, broker_url, worker_id, run_dir))
