"""Trainer checkpoints: model + optimizer through torch.distributed.checkpoint (sharded, every rank
writes its own shards), plus the lr scheduler, RNG states, the trainer version and a snapshot of
the broker side (feeder position, ledger counts, consumer-group offsets) in `meta.json`.

    RUN_DIR/checkpoints/step-00000012/{.metadata, __0_0.distcp, extra-rank0.pt, meta.json}

A checkpoint is written to `.tmp-step-N` and renamed once complete, so `latest_checkpoint`
never returns a torn one. Ordering with the broker (workers/trainer.py): the trainer logs each
step's groups in the broker BEFORE training (streamrl.accounting.log_step), saves the
checkpoint, THEN acks the entries it trained; on resume, logged steps above the checkpoint's
version are replayed from their still-pending entries, so nothing is trained twice or skipped.

    save_checkpoint(engine, run_dir, version=12, meta={...}, keep=2)   # collective: every rank
    path = latest_checkpoint(run_dir); meta = load_checkpoint(engine, path)
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

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


def save_checkpoint(engine, run_dir: Path, version: int, meta: dict, keep: int = 2) -> Path:
    """Write checkpoint `version` (collective); rank 0 renames it into place and prunes old ones."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    root = checkpoint_root(run_dir)
    tmp, final = root / f".tmp-step-{version:08d}", root / f"step-{version:08d}"
    rank = _rank()
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    t0 = time.time()
    model_sd, optim_sd = get_state_dict(engine.model, engine.optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    extra = {"scheduler": engine.scheduler.state_dict(), "rng": _rng_state(),
             "steps_done": getattr(engine, "steps_done", version)}
    torch.save(extra, tmp / f"extra-rank{rank}.pt")
    _barrier()
    if rank == 0:
        record = {"version": version, "world_size": dist.get_world_size() if dist.is_initialized() else 1,
                  "saved_at": time.time(), "save_s": round(time.time() - t0, 3), **meta}
        with open(tmp / "meta.json", "w") as fh:
            json.dump(record, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        if final.exists():  # the same version saved again after a replay: replace it whole
            shutil.rmtree(final)
        os.rename(tmp, final)
        for old in sorted(list_checkpoints(run_dir))[:-keep]:
            shutil.rmtree(root / f"step-{old:08d}", ignore_errors=True)
    _barrier()
    return final


def load_checkpoint(engine, path: Path) -> dict:
    """Restore model, optimizer, scheduler and RNG from `path` (collective); return its meta."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = Path(path)
    meta = json.loads((path / "meta.json").read_text())
    world = dist.get_world_size() if dist.is_initialized() else 1
    model_sd, optim_sd = get_state_dict(engine.model, engine.optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path))  # resharded to this world size if it changed
    set_state_dict(engine.model, engine.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    rank = _rank()
    extra_path = path / f"extra-rank{rank if meta.get('world_size') == world else 0}.pt"
    extra = torch.load(extra_path, weights_only=False)
    engine.scheduler.load_state_dict(extra["scheduler"])
    _set_rng_state(extra["rng"])
    engine.steps_done = extra.get("steps_done", meta["version"])
    return meta


def truncate_metrics(run_dir: Path | None, version: int) -> None:
    """Drop metrics.jsonl rows of steps above `version` (a resumed trainer writes them again).
    In place, so a writer that already holds the file open (append mode) keeps appending to it."""
    path = Path(run_dir) / "metrics.jsonl" if run_dir else None
    if path is None or not path.is_file():
        return
    with open(path, "r+") as fh:
        lines = fh.read().splitlines(keepends=True)
        keep = [ln for ln in lines if ln.strip() and json.loads(ln).get("step", 0) <= version]
        if len(keep) != len(lines):
            fh.seek(0)
            fh.writelines(keep)
            fh.truncate()

