"""A cgroup per sandboxed run, where this process may create one: a pids limit for the whole sandbox (the one
process limit that holds for root, whom the kernel exempts from RLIMIT_NPROC) and a memory limit for all its
processes together (RLIMIT_AS bounds each process alone). cgroup v1 (pids, memory hierarchies) and v2
(a delegated subtree with the pids/memory controllers enabled) are both handled; anything else: None.

    cg = SandboxCgroup.create(processes=32, memory_bytes=512 << 20)   # None when cgroups are not writable
    argv = cg.wrap(argv)       # a shell that joins the cgroup, then execs argv: every process starts inside
    cg.events()                # {'pids_max': n, 'oom_kill': n} after the run
    cg.destroy()               # kills what is left, removes the folders
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from functools import lru_cache
from pathlib import Path

PREFIX = "streamrl-sandbox-"


def _mounts() -> dict[str, tuple[str, str]]:
    """controller ('pids', 'memory', or '' for the v2 unified tree) -> (mount point, mount root)."""
    found: dict[str, tuple[str, str]] = {}
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, point, fstype, opts = fields[3], fields[4], tail[0], tail[2].split(",")
        if fstype == "cgroup2":
            found.setdefault("", (point, root))
        elif fstype == "cgroup":
            for ctl in ("pids", "memory"):
                if ctl in opts:
                    found.setdefault(ctl, (point, root))
    return found


def _own_dir(point: str, root: str, cg_path: str) -> Path:
    rel = cg_path[len(root) :] if root != "/" and cg_path.startswith(root) else cg_path
    return Path(point) / rel.lstrip("/")


@lru_cache(maxsize=1)
def _parents() -> dict[str, Path]:
    """Folder under which this process may create per-run cgroups, per controller ('pids', 'memory');
    a v2 tree serves both. Probed once: mkdir + rmdir of a test cgroup."""
    mounts, mine = _mounts(), {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctls, path = line.split(":", 2)
            for ctl in ctls.split(",") if ctls else [""]:
                mine[ctl] = path
    except (OSError, ValueError):
        return {}
    out: dict[str, Path] = {}
    for ctl in ("pids", "memory"):
        if ctl in mounts and ctl in mine:  # v1
            d = _own_dir(*mounts[ctl], mine[ctl])
            if _probe(d, f"{ctl}.max" if ctl == "pids" else "memory.limit_in_bytes"):
                out[ctl] = d
    if "" in mounts and "" in mine and len(out) < 2:  # v2: only where the controllers are delegated to us
        d = _own_dir(*mounts[""], mine[""])
        try:
            enabled = (d / "cgroup.subtree_control").read_text().split()
        except OSError:
            enabled = []
        for ctl in ("pids", "memory"):
            if ctl not in out and ctl in enabled and _probe(d, f"{ctl}.max"):
                out[ctl] = d
    return out


def _sweep(parent: Path) -> None:
    """Remove run folders left by a process that died mid-run (SIGKILLed callers cannot clean up); only
    empty ones go (rmdir), so a live run is never touched."""
    for d in parent.glob(f"{PREFIX}*"):
        pid = d.name[len(PREFIX) :].split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            try:
                d.rmdir()
            except OSError:
                pass


def _probe(parent: Path, limit_file: str) -> bool:
    test = parent / f"{PREFIX}probe-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    try:
        test.mkdir()
    except OSError:
        return False
    try:
        ok = (test / limit_file).exists() and os.access(test / "cgroup.procs", os.W_OK)
        if ok:
            _sweep(parent)
        return ok
    finally:
        try:
            test.rmdir()
        except OSError:
            pass


def available() -> set[str]:
    """The controllers per-run cgroups get here: a subset of {'pids', 'memory'}."""
    return set(_parents())


class SandboxCgroup:
    def __init__(self, dirs: dict[str, Path]):
        self.dirs = dirs  # controller -> this run's folder (one folder for both on v2)

    @classmethod
    def create(cls, processes: int, memory_bytes: int | None) -> SandboxCgroup | None:
        parents = _parents()
        if not parents:
            return None
        name = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:10]}"
        dirs: dict[str, Path] = {}
        try:
            for ctl, parent in parents.items():
                d = parent / name
                if d not in dirs.values():
                    d.mkdir()
                dirs[ctl] = d
            if "pids" in dirs:
                (dirs["pids"] / "pids.max").write_text(str(processes))
            if "memory" in dirs and memory_bytes:
                m = dirs["memory"]
                for f in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "memory.max", "memory.swap.max"):
                    if (m / f).exists():
                        (m / f).write_text("0" if f == "memory.swap.max" else str(memory_bytes))
        except OSError:
            cls(dirs).destroy()
            return None
        return cls(dirs)

    def wrap(self, argv: list[str]) -> list[str]:
        """argv behind /bin/sh joining every run folder first, so no process of the run starts outside."""
        procs = sorted({str(d / "cgroup.procs") for d in self.dirs.values()})
        join = " && ".join(f'echo $$ > "${i + 1}"' for i in range(len(procs)))
        return ["/bin/sh", "-c", f'{join} && shift {len(procs)} && exec "$@"', "sh", *procs, *argv]

    def events(self) -> dict[str, int]:
        out = {"pids_max": 0, "oom_kill": 0}
        for ctl, key, files in (
            ("pids", "max", ("pids.events",)),
            ("memory", "oom_kill", ("memory.events", "memory.oom_control")),
        ):
            d = self.dirs.get(ctl)
            for f in files if d else ():
                try:
                    for line in (d / f).read_text().splitlines():
                        k, _, v = line.partition(" ")
                        if k == key and v.strip().isdigit():
                            out["pids_max" if ctl == "pids" else "oom_kill"] = int(v)
                except OSError:
                    continue
        return out

    def destroy(self, timeout_s: float = 5.0) -> None:
        """Kill every process still in the run's cgroup (a sandbox's pid 1 normally took them with it),
        then remove the folders; a folder still busy after timeout_s is left behind (empty ones go)."""
        deadline = time.monotonic() + timeout_s
        for d in set(self.dirs.values()):
            while d.exists():
                try:
                    pids = [int(p) for p in (d / "cgroup.procs").read_text().split()]
                except OSError:
                    pids = []
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                try:
                    d.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.01)
