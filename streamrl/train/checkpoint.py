"""Trainer checkpoints: model + optimizer through torch.distributed.checkpoint (sharded, every rank
writes its own shards), plus the lr scheduler, RNG states, the trainer version and a snapshot of
the broker side (feeder position, ledger counts, consumer-group offsets) in `meta.json`.

    RUN_DIR/checkpoints/step-00000012/{.metadata, __0_0.distcp, extra-rank0.pt, meta.json}

A checkpoint is written to `.tmp-step-N` and renamed once complete, so `latest_checkpoint`
never returns a torn one. Ordering with the broker (workers/trainer.py): the trainer logs each
step's groups in the broker BEFORE training (streamrl.core.accounting.log_step), saves the
checkpoint, THEN acks the entries it trained; on resume, logged steps above the checkpoint's
version are replayed from their still-pending entries, so nothing is trained twice or skipped.

    save_checkpoint(engine, run_dir, version=12, meta={...}, keep=2)   # collective: every rank
    path = latest_checkpoint(run_dir); meta = load_checkpoint(engine, path)

The trainer saves through a Checkpointer: the training thread only stages the state (a CPU copy);
the files are written in the background, and the checkpoint becomes visible (renamed, and only then
does the trainer ack what it covers) once every rank's write is complete.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from streamrl.core.errors import StreamRLError
from streamrl.train.checkpoint_staging import BufferPool, optimizer_slots, staging_buffers

_STEP_DIR = re.compile(r"^step-(\d+)$")


def checkpoint_root(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: Path | None) -> dict[int, Path]:
    """version -> directory of every complete checkpoint (meta.json written last, then renamed)."""
    root = checkpoint_root(run_dir) if run_dir else None
    out: dict[int, Path] = {}
    if root is not None and root.is_dir():
        for child in root.iterdir():
            m = _STEP_DIR.match(child.name)
            if m and (child / "meta.json").is_file():
                out[int(m.group(1))] = child
    return out


def latest_checkpoint(run_dir: Path | None) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[max(found)] if found else None


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _options(engine, **extra):
    """The engine's StateDictOptions for checkpoints (a LoRA engine leaves its frozen base out)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    opts = engine.checkpoint_options() if hasattr(engine, "checkpoint_options") else {}
    return StateDictOptions(**opts, **extra)


def _state_dicts(engine) -> tuple[dict, dict]:
    """(model, optimizer) state dicts as every save and load sees them."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    return get_state_dict(engine.model, engine.optimizer, options=_options(engine))


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class PendingCheckpoint:
    """One checkpoint being written: `future` completes when every rank's DCP write is done (DCP ends
    with a collective), then finalize() publishes it on rank 0 (meta.json, rename, pruning)."""

    def __init__(self, root: Path, version: int, meta: dict, keep: int, future: Future, started: float):
        self.root, self.version, self.meta, self.keep, self.future = root, version, meta, keep, future
        self.tmp, self.path = root / f".tmp-step-{version:08d}", root / f"step-{version:08d}"
        self.started = started
        self.stall_s = 0.0
        """Seconds the calling (training) thread spent in start(): waiting for the previous
        checkpoint, collecting and staging the state; the write itself is not in it."""
        self.prepare_s = 0.0
        """Seconds a helper thread spent allocating the staging buffers (Checkpointer.prepare)."""
        self._lock = threading.Lock()
        self._final: Path | None = None

    def done(self) -> bool:
        return self.future.done()

    def finalize(self) -> Path:
        """Wait for the write, then (rank 0) make the checkpoint visible; idempotent, any thread.
        Raises what the background write raised."""
        with self._lock:
            if self._final is None:
                from torch.distributed.checkpoint.api import CheckpointException

                try:
                    self.future.result()
                except (Exception, CheckpointException) as exc:  # DCP's is a BaseException
                    raise StreamRLError(
                        f"writing checkpoint {self.version} to {self.tmp} failed: {type(exc).__name__}: {exc}; "
                        "the newest complete checkpoint is unchanged (check free space and permissions there)"
                    ) from exc
                if _rank() == 0:
                    _publish(self)
                self._final = self.path
            return self._final


def _publish(p: PendingCheckpoint) -> None:
    """meta.json last (fsynced), then the atomic rename: list_checkpoints never sees a torn one."""
    record = {
        "version": p.version,
        "world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "saved_at": time.time(),
        "save_s": round(time.time() - p.started, 3),
        **p.meta,
    }
    with open(p.tmp / "meta.json", "w") as fh:
        json.dump(record, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    if p.path.exists():  # the same version saved again after a replay: replace it whole
        shutil.rmtree(p.path)
    os.rename(p.tmp, p.path)
    for old in sorted(list_checkpoints(p.root.parent))[: -p.keep]:
        shutil.rmtree(p.root / f"step-{old:08d}", ignore_errors=True)


class Checkpointer:
    """One rank's checkpoint writer. start() is collective and returns once the state is staged (a
    CPU copy into buffers pinned on CUDA, allocated once by prepare() off the training thread and
    reused across saves); the files are written on a background thread
    (dcp.async_save over a gloo group of its own, so it never shares a collective with training).
    One checkpoint is in flight at a time: start() and wait() first finish the previous one.

        ckpt = Checkpointer(run_dir, keep=2)
        ckpt.prepare(engine)                           # at start-up and after each step (see prepare)
        pending = ckpt.start(engine, version, meta)   # training continues while it writes
        ckpt.wait()                                    # before exit, or pending.finalize()
    """

    def __init__(self, run_dir: Path, keep: int = 2, background: bool = True, storage_writer=None):
        self.root, self.keep, self.background = checkpoint_root(run_dir), keep, background
        self.storage_writer = storage_writer
        """A DCP StorageWriter factory (checkpoint dir -> writer); None: FileSystemWriter."""
        self.pending: PendingCheckpoint | None = None
        self._group = None
        self._stager = None
        self._preparing: Future | None = None
        """The BufferPool being allocated on a helper thread (prepare), until the buffers take from it."""
        self.prepare_s = 0.0
        """Seconds the helper thread took to allocate the staging buffers (0 until prepared)."""

    def _setup(self) -> None:
        if self._stager is not None:
            return
        from torch.distributed.checkpoint.staging import BlockingAsyncStager

        # BlockingAsyncStager copies tensor by tensor into its cached CPU buffers, which
        # streamrl.train.checkpoint_staging allocates (pinned on CUDA) once and every save reuses. Not
        # DefaultStager: its deepcopy-based stager in torch 2.11 has no entry for `type` objects
        # and fails on FSDP state ("KeyError: <class 'type'>", seen on H200).
        self._stager = BlockingAsyncStager(cache_staged_state_dict=True)
        if dist.is_initialized():  # collective: every rank's first prepare() or start() creates it
            self._group = dist.new_group(backend="gloo")

    def prepare(self, engine) -> None:
        """Make the first save copy only, as every later one does. Collective (the gloo group):
        every rank calls it at the same points of the step sequence, at start-up (workers/trainer.py,
        before the first batch) and after each optimizer step (streamrl/train/rank_step.py).

        At start-up a helper thread allocates a BufferPool (streamrl/train/checkpoint_staging.py) from the
        model's tensors and the optimizer's per-parameter slots. Once the optimizer has state (after
        its first step; get_state_dict would otherwise fake a step) and the pool is complete, the
        staging buffers take the state's structure, from the pool: no allocation on the training
        thread. A no-op once done, and for blocking saves (they stage nothing)."""
        if not self.background or (self._stager is not None and self._stager.state_dict_cache is not None):
            return
        if self._preparing is None:
            self._allocate_pool(engine)
        if engine.optimizer.state and self._preparing.done():
            self._assemble(engine)

    def _allocate_pool(self, engine) -> None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        self._setup()
        # references: only shapes and dtypes are read
        model_sd = get_model_state_dict(engine.model, options=_options(engine))
        params = [p for p in engine.model.parameters() if p.requires_grad]  # those with optimizer state
        slots = optimizer_slots(engine.optimizer)
        future: Future = Future()

        def allocate() -> None:
            t0 = time.perf_counter()
            try:
                pool = BufferPool.for_training(model_sd, params, slots)
            except BaseException as exc:  # start() re-raises it on the training thread
                future.set_exception(exc)
            else:
                self.prepare_s = time.perf_counter() - t0
                future.set_result(pool)

        self._preparing = future
        threading.Thread(target=allocate, name="checkpoint-staging", daemon=True).start()

    def _assemble(self, engine) -> None:
        """The staging buffers from the pool (waits for it), in the shape of the current state."""
        pool = self._preparing.result()
        model_sd, optim_sd = _state_dicts(engine)
        self._stager.state_dict_cache = pool.staging_buffers({"model": model_sd, "optim": optim_sd})
        self._preparing = None

    def prepared(self, timeout: float | None = None) -> bool:
        """Wait up to `timeout` seconds for prepare()'s pool; True once it is allocated."""
        if self._stager is not None and self._stager.state_dict_cache is not None:
            return True
        if self._preparing is None:
            return False
        try:
            self._preparing.result(timeout)
        except TimeoutError:
            return False
        return True

    def _staged_cache(self, engine, state: dict) -> None:
        """The stager's buffers before a save: from the prepared pool (waiting for the helper thread
        if it is still allocating), else allocated now."""
        if self._stager.state_dict_cache is not None:
            return
        if self._preparing is not None:
            self._assemble(engine)
        else:
            self._stager.state_dict_cache = staging_buffers(state)

    def start(self, engine, version: int, meta: dict) -> PendingCheckpoint:
        """Stage checkpoint `version` and start writing it (collective); see the class docstring."""
        import torch.distributed.checkpoint as dcp

        t0 = time.perf_counter()
        self.wait()
        self._setup()
        rank = _rank()
        tmp = self.root / f".tmp-step-{version:08d}"
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        _barrier()
        model_sd, optim_sd = _state_dicts(engine)
        # Small per-rank state, written before the DCP write starts: its completion (a collective)
        # then implies every rank's extra file is on disk.
        extra = {
            "scheduler": engine.scheduler.state_dict(),
            "rng": _rng_state(),
            "steps_done": getattr(engine, "steps_done", version),
        }
        torch.save(extra, tmp / f"extra-rank{rank}.pt")
        state = {"model": model_sd, "optim": optim_sd}
        writer = self.storage_writer(str(tmp)) if self.storage_writer else None
        if self.background:
            self._staged_cache(engine, state)
            future = dcp.async_save(
                state,
                checkpoint_id=str(tmp),
                storage_writer=writer,
                process_group=self._group,
                async_stager=self._stager,
            )
        else:
            future = Future()
            future.set_result(dcp.save(state, checkpoint_id=str(tmp), storage_writer=writer))
        self.pending = PendingCheckpoint(self.root, version, meta, self.keep, future, time.time())
        self.pending.stall_s = time.perf_counter() - t0
        self.pending.prepare_s = self.prepare_s
        return self.pending

    def wait(self) -> Path | None:
        """Finish the checkpoint in flight, if any (re-raises its write error); its final path."""
        pending, self.pending = self.pending, None
        return pending.finalize() if pending is not None else None

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._preparing = None
            if self._stager is not None:
                self._stager.close()
                self._stager = None


def save_checkpoint(engine, run_dir: Path, version: int, meta: dict, keep: int = 2) -> Path:
    """Write checkpoint `version` and wait for it (collective); rank 0 renames it into place."""
    ckpt = Checkpointer(run_dir, keep, background=False)
    try:
        ckpt.start(engine, version, meta)
        path = ckpt.wait()
    finally:
        ckpt.close()
    _barrier()
    return path


def load_checkpoint(engine, path: Path) -> dict:
    """Restore model, optimizer, scheduler and RNG from `path` (collective); return its meta."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    path = Path(path)
    meta = json.loads((path / "meta.json").read_text())
    world = dist.get_world_size() if dist.is_initialized() else 1
    model_sd, optim_sd = _state_dicts(engine)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path))  # resharded to this world size if it changed
    # Without the frozen base in the file, its keys are missing by design: load non-strict, then
    # check that exactly those (and nothing trained) were missing.
    partial_model = _options(engine).ignore_frozen_params
    keys = set_state_dict(
        engine.model,
        engine.optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
        options=_options(engine, strict=not partial_model),
    )
    if partial_model:
        trained = {n for n, p in engine.model.named_parameters() if p.requires_grad}
        if lost := sorted(set(keys.missing_keys) & trained) + sorted(keys.unexpected_keys):
            raise StreamRLError(
                f"checkpoint {path} does not match the trainer's adapter ({lost[:4]} missing or unexpected); "
                "resume with the trainer.lora settings the run was saved with"
            )
    rank = _rank()
    extra_path = path / f"extra-rank{rank if meta.get('world_size') == world else 0}.pt"
    extra = torch.load(extra_path, weights_only=False)
    engine.scheduler.load_state_dict(extra["scheduler"])
    _set_rng_state(extra["rng"])
    engine.steps_done = extra.get("steps_done", meta["version"])
    return meta


def truncate_metrics(run_dir: Path | None, version: int) -> None:
    """Drop metrics.jsonl and samples.jsonl rows of steps above `version` (a resumed trainer writes
    them again). In place, so a writer that already holds a file open (append mode) keeps appending to it."""
    for name in ("metrics.jsonl", "samples.jsonl"):
        path = Path(run_dir) / name if run_dir else None
        if path is None or not path.is_file():
            continue
        with open(path, "r+") as fh:
            lines = fh.read().splitlines(keepends=True)
            keep = [ln for ln in lines if ln.strip() and json.loads(ln).get("step", 0) <= version]
            if len(keep) != len(lines):
                fh.seek(0)
                fh.writelines(keep)
                fh.truncate()
