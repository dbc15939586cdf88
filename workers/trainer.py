"""Trainer role: assemble staleness-bounded batches, train with FSDP2 ranks, publish versioned weights.

    streamrl worker trainer --config configs/tiny-cpu.yaml --broker redis://... --run tiny

Launches cfg.trainer.world_size torch.distributed ranks (or joins torchrun's). Rank 0 owns the
broker side: the assembler, the weight store and metrics. It decides each step (the batch, whether
to snapshot and to checkpoint) and every rank runs that step through streamrl/train/rank_step.py, the one
function all ranks execute. After each step the version v+1 is snapshot on rank 0 and published in
the background, so the loop's only publishing cost is the snapshot copy.

Recovery (streamrl/train/checkpoint.py, streamrl/core/accounting.py): each step's groups are logged in the
broker before training; a checkpoint is saved every trainer.checkpoint_every steps, and only then
are the trained entries acked. A restarted trainer loads the newest checkpoint and replays the
logged steps above it from their still-pending entries, so no group is trained twice or skipped.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import torch

from streamrl.assemble.assembler import Assembler
from streamrl.config.schema import Config
from streamrl.core import accounting, run_end
from streamrl.core.errors import NOT_TRANSIENT, StreamRLError
from streamrl.core.messages import Control, encode
from streamrl.core.trimming import trim_periodically
from streamrl.core.worker import Serve, Worker, startup_failure
from streamrl.generate.episode_sample import episode_metrics
from streamrl.train.checkpoint import (
    Checkpointer,
    PendingCheckpoint,
    latest_checkpoint,
    load_checkpoint,
    truncate_metrics,
)
from streamrl.train.dist import broadcast_object, launch
from streamrl.train.engine_interface import TrainerEngine
from streamrl.train.engines import make_engine
from streamrl.train.flops import model_coefficients, peak_flops, row_flops
from streamrl.train.generator_rates import GeneratorRates
from streamrl.train.metrics import MetricsWriter, step_row
from streamrl.train.rank_step import RankStep, StepOrder, follow
from streamrl.weights.store import make_publisher, publisher_class


class TrainerWorker(Worker):
    role = "trainer"
    measures_busy = False  # a step includes waiting for its batch; metrics.jsonl has train_s vs wait_s

    def __init__(
        self, cfg: Config, broker, worker_id: str, run_dir: Path | None, ranks: RankStep, resumed: dict | None = None
    ):
        super().__init__(cfg, broker, worker_id, run_dir)
        self.ranks = ranks
        """Runs each step on every rank (this one included): the only way this worker trains."""
        self.engine: TrainerEngine = ranks.engine
        self.resumed = resumed
        """meta.json of the checkpoint this process started from (None: fresh weights, version 0)."""
        self.unacked: list = []
        """Batches trained since the last checkpoint: acked once a checkpoint covers them."""
        self.replay: dict[int, dict] = {}
        self._clean = True
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="train")
        self.metrics = MetricsWriter(run_dir, cfg)
        self.publishing: asyncio.Task | None = None
        self.train_intervals: list[tuple[float, float]] = []
        self.committing: asyncio.Task | None = None
        """The checkpoint in flight: waits for its write, publishes it, then acks what it covers."""

    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def start(self) -> None:
        await run_end.clear_ended(self.broker, self.keys)  # a resumed run runs again
        self.assembler = Assembler(self.cfg, self.broker, self.log, self.count, consumer=self.worker_id)
        await self.assembler.start()
        self.assembler.vocab_size = self.engine.vocab_size
        self.publisher = make_publisher(self.cfg, self.broker, self.run_dir)
        self.version = int(self.resumed["version"]) if self.resumed else 0
        await self._resume()
        self.assembler.start_intake()  # after _resume: closed groups are known before any entry is filed
        self.t_start = time.time()
        self._flops = model_coefficients(self.cfg.model.path)
        device = getattr(self.engine, "device", None)
        self._peak = peak_flops(torch.cuda.get_device_name(device) if getattr(device, "type", "") == "cuda" else "")
        self._gen_rates = GeneratorRates(self.broker, self.keys)
        self._trimmer = asyncio.create_task(
            trim_periodically(self.broker, self.cfg, lambda n: self.count("trimmed", n), self.log)
        )
        self.log.info(
            "trainer_ready",
            policy_version=self.version,
            steps=self.cfg.trainer.steps,
            world_size=self.engine.world_size,
        )

    async def _resume(self) -> None:
        """Line the broker up with the checkpoint: closed groups, steps to replay, version, weights."""
        self.replay, closed, replay_groups = await accounting.resume_plan(self.broker, self.keys, self.version)
        self.assembler.restore(closed, replay_groups)
        self.checkpointed = self.version
        await self.broker.set(accounting.LedgerKeys(self.keys).checkpointed, self.version)
        current = int(await self.broker.get(self.keys.trainer_version) or 0)
        self.broker_version = max(current, self.version)
        await self.broker.set(self.keys.trainer_version, self.broker_version)  # never backwards
        truncate_metrics(self.run_dir, self.version)  # replayed steps write their rows again
        if self.version > 0:  # the weights of this version may be gone (shm is cleared on exit)
            result = await self._call(self.ranks, StepOrder(self.version, snapshot=True))
            await self.publisher.publish(self.version, result.state, adapter=self.engine.adapter_config())
        if self.resumed or self.replay:
            self.log.info(
                "resumed",
                policy_version=self.version,
                replay_steps=sorted(self.replay),
                closed_groups=len(closed),
                broker_version=current,
            )

    @property
    def _saves(self) -> bool:
        """Checkpoints are written (a trainer without a run directory only acks at each save point)."""
        return self.run_dir is not None

    def _save_due(self, version: int) -> bool:
        return version % self.cfg.trainer.checkpoint_every == 0 or version >= self.cfg.trainer.steps

    async def _checkpoint(self) -> float:
        """Save the current version (a rank step of its own) and commit it; see _after_save."""
        result = await self._call(self.ranks, StepOrder(self.version, save=self._saves))
        await self._describe(result.pending)
        return await self._after_save(result.pending)

    async def _describe(self, pending: PendingCheckpoint | None) -> None:
        """Fill in the broker side of meta.json, which rank 0 writes when it finalizes the checkpoint
        (the next save's start or _commit, both after this)."""
        if pending is None:
            return
        pending.meta = {
            "feeder_admitted": int(await self.broker.get(self.keys.feeder_admitted) or 0),
            "groups_released": int(await self.broker.get(self.keys.trainer_released) or 0),
            "assembler": dict(self.assembler.counters),
            "offsets": {
                s: await self.broker.group_info(s) for s in self.keys.rollout_streams + self.keys.annotation_streams
            },
        }

    async def _after_save(self, pending: PendingCheckpoint | None) -> float:
        """Once the ranks started a save: return the seconds it blocked training. When the write
        completes, it is marked in the broker and THEN what it covers is acked (_commit)."""
        t0 = time.perf_counter()
        await self._committed()  # one checkpoint in flight: the previous one is published first
        batches, self.unacked = self.unacked, []
        if pending is None:
            for batch in batches:
                await self.assembler.commit(batch)
            return time.perf_counter() - t0
        self.committing = asyncio.create_task(self._commit(pending, batches))
        return pending.stall_s + time.perf_counter() - t0

    async def _commit(self, pending, batches: list) -> None:
        await asyncio.wrap_future(pending.future)
        await asyncio.to_thread(pending.finalize)
        await self.broker.set(accounting.LedgerKeys(self.keys).checkpointed, pending.version)
        self.checkpointed = pending.version
        self.log.info(
            "checkpoint_saved",
            policy_version=pending.version,
            write_s=round(time.time() - pending.started, 3),
            stall_s=round(pending.stall_s, 4),
            staging_prepare_s=round(pending.prepare_s, 3),
        )
        for batch in batches:
            await self.assembler.commit(batch)

    async def _committed(self) -> None:
        """Wait for the checkpoint in flight to be published and acked (re-raises its failure)."""
        task, self.committing = self.committing, None
        if task is not None:
            await task

    def _overlap(self, rollouts) -> int:
        """Rollouts that finished while the trainer was busy training: generation overlapped training."""
        return sum(1 for r in rollouts for a, b in self.train_intervals if a <= r.finished_at <= b)

    async def step(self) -> bool:
        if self.version >= self.cfg.trainer.steps:
            self.done = True
            return False
        record = self.replay.get(self.version + 1)
        if record is not None:
            batch = await self.assembler.replay_batch(record["groups"], self.version, stop=self.stopping.is_set)
        else:
            batch = await self.assembler.next_batch(self.version, stop=self.stopping.is_set)
        if batch is None:
            return False
        self._clean = False
        await self._log_step(batch, replay=record is not None)
        version = self.version + 1
        save = self._save_due(version)
        # The snapshot is the loop's only publish cost; a due checkpoint is staged in the same step.
        result = await self._call(self.ranks, StepOrder(version, batch=batch, snapshot=True, save=save and self._saves))
        m, t0, t1 = result.metrics, result.train_start, result.train_end
        self.version = version
        t_meta = time.perf_counter()
        await self._describe(result.pending)
        meta_s = time.perf_counter() - t_meta
        if self.publishing is not None:
            await self.publishing  # one publish in flight at a time
        self.publishing = asyncio.create_task(
            self.publisher.publish(self.version, result.state, adapter=self.engine.adapter_config())
        )
        if self.version > self.broker_version:  # replayed steps are already announced
            self.broker_version = self.version
            await self.broker.set(self.keys.trainer_version, self.version)
        self.unacked.append(batch)
        if self.version >= self.cfg.trainer.steps:
            await self._final_eval()
        overlap = self._overlap(batch.rollouts)
        # Groups the generators failed (episode failures, rejected prompts) count in `failed` too.
        failed = float(await self.broker.get(self.keys.stat("groups_failed")) or 0)
        batch.stats["failed"] = batch.stats.get("failed", 0.0) + failed
        if self.cfg.env.fn:  # multi-turn: the running count of failed episodes for metrics.jsonl
            batch.stats["episodes_failed"] = float(await self.broker.get(self.keys.stat("episodes_failed")) or 0)
        self.train_intervals = (self.train_intervals + [(t0, t1)])[-8:]
        if self.committing is not None and self.committing.done():
            await self._committed()  # surfaces a failed background write at the next step
        ckpt_s = meta_s + await self._after_save(result.pending) if save else None
        try:  # the generators' decode rate beside this step's wait (metrics.jsonl gen_tokens_per_s, gen_busy)
            batch.stats.update(await self._gen_rates.sample())
        except Exception as exc:  # a broker hiccup costs the row these two keys, never the step
            self.log.warning("generator_rates_unread", error=repr(exc))
        # The row is written before the checkpoint can become visible (_commit runs after this
        # coroutine's next await), so a resume from it never lacks the row of its own step.
        self._record(batch, m, overlap, train_s=t1 - t0, stall_s=result.snapshot_s, checkpoint_s=ckpt_s)
        self._clean = True
        return True

    async def _final_eval(self) -> None:
        """With eval.at_end, wait (bounded) for the round of the final weights before the last row."""
        ev = self.cfg.eval
        if not (ev.every_steps and ev.at_end):
            return
        deadline = time.monotonic() + ev.final_timeout_s
        while not self.assembler.evals.has(self.version) and time.monotonic() < deadline:
            if self.stopping.is_set():
                return
            await self.assembler.advance()
        if not self.assembler.evals.has(self.version):
            self.log.warning("final_eval_missing", policy_version=self.version, waited_s=ev.final_timeout_s)

    async def _log_step(self, batch, replay: bool) -> None:
        """Write-ahead: record which groups/rollouts step v+1 trains before training it."""
        step = self.version + 1
        new, logged = await accounting.log_step(
            self.broker, self.keys, step, batch.group_ids, [r.rollout_id for r in batch.rollouts]
        )
        if not new and logged["groups"] != batch.group_ids:
            raise StreamRLError(
                f"step {step} was logged with groups {logged['groups']} but the trainer rebuilt "
                f"{batch.group_ids}; the broker's ledger and RUN_DIR/checkpoints disagree "
                "(a checkpoint from another run?)"
            )
        if new and logged["clashes"]:
            self.log.error("double_training", step=step, groups=logged["clashes"])
        if replay:
            self.replay.pop(step, None)
            self.log.info("step_replayed", step=step)

    def _record(
        self, batch, m: dict, overlap: int, train_s: float, stall_s: float, checkpoint_s: float | None = None
    ) -> None:
        engine = {("engine_time_s" if k == "time_s" else k): v for k, v in m.items() if k not in ("tokens", "seqs")}
        rec = {
            **step_row(batch, self.version, time.time() - self.t_start, train_s, stall_s=stall_s, overlap=overlap),
            **episode_metrics(batch.rollouts),
            **engine,
        }
        if self._flops is not None and train_s > 0:  # model FLOPs of the step's rows (streamrl/train/flops.py)
            flops = row_flops(*self._flops, [len(r.prompt_ids) + len(r.completion_ids) for r in batch.rollouts])
            rec["train_tflops"] = round(flops / train_s / self.engine.world_size / 1e12, 4)  # per rank
            if self._peak:
                rec["mfu"] = round(flops / train_s / (self.engine.world_size * self._peak), 4)
        if checkpoint_s is not None:  # steps that saved: how long the save blocked training
            rec["checkpoint_stall_s"] = round(checkpoint_s, 4)
        evals = self.assembler.evals  # finished eval rounds (streamrl/eval/collector.py)
        if evaluation := (evals.take_all() if self.version >= self.cfg.trainer.steps else evals.take()):
            rec.update(evaluation)
            self.log.info("eval", **{k.replace("/", "_").replace("@", "_at_"): v for k, v in evaluation.items()})
        line = self.metrics.write(rec)
        self.metrics.write_samples(batch, self.version)
        asyncio.get_running_loop().create_task(self.broker.add(self.keys.metrics, line.encode(), maxlen=10_000))
        self.log.info(
            "step",
            step=self.version,
            reward=round(rec["reward_mean"], 3),
            staleness_max=rec["staleness_max"],
            wait_s=rec["wait_s"],
            train_s=rec["train_s"],
            zero_variance_frac=rec["zero_variance_frac"],
            **{k: round(rec[k], 5) for k in ("loss", "kl", "entropy", "grad_norm") if isinstance(rec.get(k), float)},
            # generator/trainer mismatch of the trained tokens (streamrl/train/mismatch.py)
            **{k: round(rec[k], 5) for k in ("mismatch_kl_s0", "mismatch_kl_stale") if k in rec},
        )

    async def close(self) -> None:
        if hasattr(self, "assembler"):
            await self.assembler.stop_intake()
        if hasattr(self, "_trimmer"):
            self._trimmer.cancel()
        if self.publishing is not None:
            await self.publishing
        if self._clean and self.unacked:  # a graceful stop between checkpoints: keep what was trained
            await self._checkpoint()
        # A checkpoint in flight was staged after a complete step, so it is valid even if a later
        # step failed: finish it (and ack what it covers) before the ranks go.
        await self._committed()
        await self._call(self.ranks.stop)  # every rank (this one too) finishes its checkpoint writes
        if self.done:
            await self.broker.add(
                self.keys.control, encode(Control(action="stop", version=self.version, reason="trainer finished"))
            )
            await run_end.mark_ended(self.broker, self.keys, "trainer finished", self.version)
        self.metrics.close()
        self.pool.shutdown(wait=True)


def _load_newest(engine, run_dir: Path | None, rank: int) -> dict | None:
    """Every rank loads the checkpoint rank 0 picks (the newest complete one), if any."""
    path = broadcast_object(str(latest_checkpoint(run_dir)) if rank == 0 and latest_checkpoint(run_dir) else None)
    return load_checkpoint(engine, Path(path)) if path else None


def warm_up(engine, cfg: Config) -> None:
    """trainer.warm_up (config docstring): while the generators start, the first step's one-off costs."""
    on = cfg.trainer.warm_up if cfg.trainer.warm_up is not None else engine.device.type == "cuda"
    if not on:
        return
    import structlog

    if cfg.trainer.seq_multiple() > 1:
        # One prompt token and a full completion: the length bucket of the job's full-length rows,
        # compiled as a static graph (a second bucket would make the dynamic one that replaces it).
        lengths = (min(cfg.generator.max_tokens + 1, cfg.generator.max_model_len),)
    else:
        length = min(cfg.generator.max_tokens, cfg.generator.max_model_len)
        lengths = (length, length - 1)
    t0 = time.perf_counter()
    engine.warm_up(lengths)
    if engine.rank == 0:
        structlog.get_logger("streamrl").info(
            "trainer_warmed_up", seconds=round(time.perf_counter() - t0, 2), lengths=list(lengths)
        )


def _rank_main(cfg: Config, serve: Serve, worker_id: str, run_dir: Path | None, rank: int, world: int) -> None:
    from streamrl.core.logs import setup_logging

    if world > 1:  # a spawned rank starts with no logging set up: rank 0 writes the trainer's JSON log
        setup_logging("trainer", worker_id if rank == 0 else f"{worker_id}-rank{rank}", run_dir, run=cfg.run.name)
    try:
        engine = make_engine(cfg, cfg.model.path, rank, world)
    except NOT_TRANSIENT as exc:
        raise startup_failure("trainer", exc) from exc
    resumed = _load_newest(engine, run_dir, rank)
    warm_up(engine, cfg)
    tc = cfg.trainer
    snapshot = partial(publisher_class(cfg.weights.backend).snapshot, dtype=cfg.model.dtype)
    checkpointer = Checkpointer(run_dir, tc.checkpoint_keep, tc.checkpoint_async)
    checkpointer.prepare(engine)  # the staging buffers, allocated while the generators start
    ranks = RankStep(engine, snapshot, checkpointer)
    if rank == 0:
        serve(lambda broker: TrainerWorker(cfg, broker, worker_id, run_dir, ranks, resumed))
    else:
        follow(ranks)


def main(cfg: Config, worker_id: str, run_dir: Path | None, serve: Serve) -> None:
    """The trainer role (streamrl/launch/runtime.py starts it): its ranks, rank 0 running TrainerWorker
    through `serve` (the launcher's: broker connection, signals, the worker loop)."""
    launch(cfg.trainer.world_size, partial(_rank_main, cfg, serve, worker_id, run_dir))
