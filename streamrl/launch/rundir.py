"""The state of a run directory: is a `streamrl up` running in it, did an earlier one use it, has it finished.

`streamrl up` holds an exclusive lock on RUN_DIR/up.lock for as long as it runs (the kernel drops
it when the process ends, however it ends), so `scale` and `status` can tell a live run from a
finished one, and a second `up` on the same directory is refused instead of sharing its broker.

    lock = claim(run_dir)            # in `up`; raises ConfigError if another `up` holds it
    is_live(run_dir)                 # in `scale` / `status`
    finished_summary(run_dir)        # RUN_DIR/summary.json of an ended run, else None
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

from streamrl.core.errors import ConfigError

LOCK_FILE = "up.lock"
SUMMARY_FILE = "summary.json"
USED_MARKERS = ("metrics.jsonl", "checkpoints")
"""What an earlier `streamrl up` that trained a step leaves in its run directory."""
UNSTARTED_LEFTOVERS = ("broker", "summary.json", "scale.json")
"""What an earlier `streamrl up` that stopped before its first step leaves besides config.yaml and logs/:
its broker's data (admitted prompts, counters) would mix into a new job's accounting."""


def new_run_dir(runs: Path, name: str) -> Path:
    """A fresh runs/<name>-<timestamp>[-N]: created exclusively, so two jobs started in the same second
    never share one."""
    stem = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    runs.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        path = runs / (stem if n == 1 else f"{stem}-{n}")
        try:
            path.mkdir()
            return path.resolve()
        except FileExistsError:
            continue
    raise ConfigError(f"{runs} has 999 run directories named {stem}*; pass --run-dir")


def claim(run_dir: Path):
    """Lock `run_dir` for this `streamrl up` (keep the returned file open while the job runs)."""
    fh = open(Path(run_dir) / LOCK_FILE, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        pid = fh.read().strip() or "?"
        fh.close()
        raise ConfigError(
            f"another `streamrl up` (pid {pid}) is running in {run_dir}; stop it first (Ctrl-C), "
            "or pass another --run-dir"
        ) from None
    fh.truncate(0)
    fh.write(f"{os.getpid()}\n")
    fh.flush()
    return fh


def is_live(run_dir: Path) -> bool:
    """Is a `streamrl up` running in `run_dir` right now?"""
    path = Path(run_dir) / LOCK_FILE
    if not path.is_file():
        return False
    with open(path) as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


def earlier_run(run_dir: Path) -> str | None:
    """What shows that an earlier `streamrl up` trained in `run_dir` (None: a fresh folder, or one whose
    job stopped before its first step, e.g. at a model it could not load: nothing there to continue)."""
    found = [m for m in USED_MARKERS if (Path(run_dir) / m).exists()]
    return ", ".join(found) or None


def clear_unstarted(run_dir: Path) -> list[str]:
    """Remove what a job that never trained left in `run_dir` (call only when earlier_run is None); the
    names removed. Its logs/ stay (a new job appends to them), its config.yaml is rewritten."""
    import shutil

    removed = []
    for name in UNSTARTED_LEFTOVERS:
        path = Path(run_dir) / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        else:
            continue
        removed.append(name)
    return removed


def finished_summary(run_dir: Path) -> dict | None:
    """RUN_DIR/summary.json of a run whose `streamrl up` has ended (None while one runs, or without one)."""
    path = Path(run_dir) / SUMMARY_FILE
    if is_live(run_dir) or not path.is_file():
        return None
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def describe_finished(run_dir: Path, s: dict) -> str:
    """Two lines for a finished run: what it trained and its accounting (from its summary.json)."""
    parts = ("trained", "dropped_stale", "filtered", "failed", "requeued", "in_flight", "lost")
    line = " + ".join(f"{k} {s.get(k, '?')}" for k in parts)
    holds = "holds" if s.get("invariant_holds") else "VIOLATED"
    return (
        f"the run in {run_dir} has finished (no `streamrl up` is running there): {s.get('trained_steps', '?')} "
        f"steps trained, checkpointed version {s.get('checkpointed_version', '?')}.\n"
        f"summary ({Path(run_dir) / SUMMARY_FILE}): groups admitted {s.get('admitted', '?')} = {line}; "
        f"double-trained rollouts {s.get('double_trained', '?')}; invariant {holds}. "
        f"`streamrl up --resume {run_dir}` continues it."
    )
