"""Was a dead child killed by the kernel's OOM killer? Only what the host lets us observe is claimed.

A SIGKILL alone says nothing: `kill -9`, a container runtime or another supervisor send it too.
Evidence, best first:

- the kernel log (/dev/kmsg; readable by root, or everyone with kernel.dmesg_restrict=0): the
  OOM killer writes "Killed process PID (...)" (older kernels) / "oom-kill:...,pid=PID,..." for the
  exact process it killed. Only records written after the child started count: the log keeps old
  kills, and their pids are handed out again (a test suite that OOM-kills on purpose, then a job
  whose generator got a recycled pid and was `kill -9`ed, would otherwise read as "out of memory");
- the `oom_kill` counter of this process's memory cgroup (cgroup v2 memory.events, v1
  memory.oom_control), else the host's (/proc/vmstat): if it rose while the child ran, the OOM
  killer killed *something* near it at that time ("likely").

    watch = OomWatch()
    mark = watch.mark()                             # when the child starts
    watch.evidence({pid, *tree_pids}, mark)         # after it died: "" when nothing points to OOM
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path

_KILLED = re.compile(rb"(?:Killed process (\d+)|oom-kill:.*?[,:]pid=(\d+))")


def _cgroup_counter_files(
    proc_cgroup: str = "/proc/self/cgroup", root: Path = Path("/sys/fs/cgroup")
) -> list[tuple[Path, str]]:
    """(file, key) pairs holding this process's cgroup oom_kill count, most specific first."""
    out: list[tuple[Path, str]] = []
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "":  # cgroup v2 (unified; under /unified on a hybrid host)
            for base in (root, root / "unified"):
                out += [(base / rel / "memory.events", "oom_kill"), (base / "memory.events", "oom_kill")]
        elif "memory" in controllers.split(","):  # cgroup v1; in a cgroup namespace the mount root is ours
            base = root / "memory"
            out += [(base / rel / "memory.oom_control", "oom_kill"), (base / "memory.oom_control", "oom_kill")]
    return out


def _read_counter(path: Path, key: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return None


def _kernel_log(kmsg: str) -> list[tuple[int, bytes]] | None:
    """(sequence number, message) of every record in the kernel's ring buffer; None if unreadable."""
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    records: list[tuple[int, bytes]] = []
    try:
        while True:
            try:
                record = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EAGAIN:  # the end of the buffer
                    break
                if exc.errno == errno.EPIPE:  # a record was overwritten while reading: skip it
                    continue
                return None  # EPERM etc.: not observable here
            if not record:
                break
            prefix, _, message = record.partition(b";")  # "priority,sequence,microseconds,flags[,...];text"
            try:
                seq = int(prefix.split(b",")[1])
            except (IndexError, ValueError):
                continue
            records.append((seq, message.strip()))
    finally:
        os.close(fd)
    return records


def kernel_log_kills(kmsg: str = "/dev/kmsg", after_seq: int = -1) -> dict[int, str] | None:
    """pid -> kernel log line for every OOM kill logged after record `after_seq`; None if unreadable."""
    records = _kernel_log(kmsg)
    if records is None:
        return None
    kills: dict[int, str] = {}
    for seq, message in records:
        if seq > after_seq and (m := _KILLED.search(message)):
            kills[int(m.group(1) or m.group(2))] = message.decode(errors="replace")[:200]
    return kills


def kernel_log_end(kmsg: str = "/dev/kmsg") -> int | None:
    """The sequence number of the kernel log's newest record (-1 if empty); None if unreadable."""
    records = _kernel_log(kmsg)
    return None if records is None else max((seq for seq, _ in records), default=-1)


@dataclass(frozen=True)
class OomMark:
    """Where the evidence stood when a child started: what came after it is about the child."""

    kernel_log_seq: int | None = None
    counter: int | None = None


class OomWatch:
    """Reads the OOM evidence this host offers (found once, at construction)."""

    def __init__(
        self,
        kmsg: str = "/dev/kmsg",
        proc_cgroup: str = "/proc/self/cgroup",
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        vmstat: Path = Path("/proc/vmstat"),
    ):
        self.kmsg = kmsg
        candidates = _cgroup_counter_files(proc_cgroup, cgroup_root) + [(vmstat, "oom_kill")]
        self.source = next(((p, k) for p, k in candidates if _read_counter(p, k) is not None), None)
        """(file, key) of the oom_kill counter used, or None where none is readable."""

    def counter(self) -> int | None:
        return _read_counter(*self.source) if self.source else None

    def mark(self) -> OomMark:
        """Taken when a child starts; `evidence` then looks only at what came after it."""
        return OomMark(kernel_log_end(self.kmsg), self.counter())

    def evidence(self, pids: set[int], mark: OomMark | None) -> str:
        """Why the processes `pids` (a dead child's tree) look OOM-killed, or "" if nothing shows it."""
        mark = mark or OomMark()
        after = -1 if mark.kernel_log_seq is None else mark.kernel_log_seq
        kills = kernel_log_kills(self.kmsg, after)
        if kills is not None:  # the log names every process the OOM killer took since the mark: decisive
            pid = next((p for p in sorted(pids) if p in kills), None)
            return (
                "" if pid is None else f"killed by the kernel's OOM killer: out of memory (kernel log: {kills[pid]!r})"
            )
        now, before = self.counter(), mark.counter
        if before is not None and now is not None and now > before:
            return (
                f"likely out of memory: the kernel's OOM killer fired while it ran "
                f"({self.source[0]} oom_kill {before} -> {now})"
            )
        return ""
