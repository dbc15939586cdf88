"""What a role's process tree leaves on the host when it is killed: POSIX shared-memory segments.

vLLM's EngineCore and its workers talk through shared-memory message queues (`/dev/shm/psm_*`,
VLLM_MQ_MAX_CHUNK_BYTES_MB x 10 chunks: 160 MB each by default) that only a clean shutdown
unlinks, so every SIGKILLed generator leaves some behind and restarts fill /dev/shm. The
supervisor records the segments each child's tree has open or mapped while it runs
(`ProcessTree.scan`, every few seconds), and once the tree is dead removes the recorded ones
that no live process still uses (`ProcessTree.remove_leftovers`). Only names the dead tree itself
had open are candidates, never "every psm_* on the host" (those may belong to another job), and
only entries directly in /dev/shm (what shm_open creates), so the shm weight store's
/dev/shm/streamrl-<run>/ directory is never touched.

    tree = ProcessTree()
    tree.scan(child.pid)                 # while it runs
    removed = tree.remove_leftovers()    # after it died: [(path, bytes), ...]
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

SHM_DIR = Path("/dev/shm")
SCAN_EVERY_S = 2.0
"""How often the supervisor records each child tree's segments (vLLM creates them at engine start)."""


def _shm_in_use(pid: int, shm_dir: Path = SHM_DIR) -> set[Path]:
    """Top-level /dev/shm entries process `pid` has mapped or open (empty if it is gone or not ours)."""
    prefix = str(shm_dir) + "/"
    found: set[Path] = set()
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            for line in f:
                if b"/dev/shm/" in line:
                    path = line.split(None, 5)[-1].strip().decode(errors="replace").removesuffix(" (deleted)")
                    if path.startswith(prefix) and "/" not in path[len(prefix) :]:
                        found.add(Path(path))
        fd_dir = f"/proc/{pid}/fd"
        for fd in os.listdir(fd_dir):
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue  # closed meanwhile
            if target.startswith(prefix) and "/" not in target[len(prefix) :]:
                found.add(Path(target))
    except OSError:  # gone, or another user's process
        pass
    return found


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


@dataclass
class ProcessTree:
    """The processes and shared-memory segments one child (and everything it started) was seen with."""

    pids: dict[int, float] = field(default_factory=dict)
    """pid -> create_time (a pid is only "ours" while its create_time matches: pids are reused)."""
    shm: set[Path] = field(default_factory=set)
    last_scan: float = 0.0

    def scan(self, pid: int) -> None:
        """Record the live tree under `pid` and the segments its processes have open or mapped."""
        self.last_scan = time.monotonic()
        for proc in _tree(pid):
            try:
                self.pids.setdefault(proc.pid, proc.create_time())
            except psutil.Error:
                continue
            self.shm |= _shm_in_use(proc.pid)

    def due(self) -> bool:
        return time.monotonic() - self.last_scan >= SCAN_EVERY_S

    def alive(self) -> list[psutil.Process]:
        out = []
        for pid, created in self.pids.items():
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(proc)
            except psutil.Error:
                pass
        return out

    def remove_leftovers(self, wait_s: float = 5.0) -> list[tuple[Path, int]]:
        """Unlink the recorded segments that still exist once the tree is gone and nothing else uses them.

        Waits up to `wait_s` for the tree's processes to exit (a SIGKILL is not instantaneous); a
        process still alive after that keeps its segments (they are not leftovers yet)."""
        candidates = {p for p in self.shm if p.exists()}
        if not candidates:
            return []
        deadline = time.monotonic() + wait_s
        while self.alive() and time.monotonic() < deadline:  # zombies count as gone: their maps are empty
            time.sleep(0.02)
        in_use: set[Path] = set()
        for proc in psutil.process_iter():
            in_use |= _shm_in_use(proc.pid) & candidates
        removed = []
        for path in sorted(candidates - in_use):
            try:
                size = path.stat().st_size
                path.unlink()
            except OSError:
                continue  # removed meanwhile (e.g. by the resource tracker)
            removed.append((path, size))
        self.shm -= {p for p, _ in removed}
        return removed


def describe_removed(removed: list[tuple[Path, int]]) -> str:
    mb = sum(size for _, size in removed) / 2**20
    names = ", ".join(p.name for p, _ in removed[:4]) + (", ..." if len(removed) > 4 else "")
    return f"removed {len(removed)} shared-memory segment(s) it left in /dev/shm ({mb:.0f} MB: {names})"
