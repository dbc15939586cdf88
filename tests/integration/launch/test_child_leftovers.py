"""What a killed role leaves on the host, through the supervisor's death path with real processes:
its shared-memory segments are removed (not other processes'), "out of memory" is said only
when the kernel's OOM killer did it, and a killed trainer ends the run naming the setting to change.

    pytest tests/integration/launch/test_child_leftovers.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from multiprocessing import shared_memory
from pathlib import Path

import pytest

from streamrl.config.schema import Config
from streamrl.core.errors import WorkerDied
from streamrl.launch.oom import OomWatch
from streamrl.launch.supervisor import Child, Supervisor

ROOT = Path(__file__).resolve().parents[3]


def start_tree(tmp_path: Path, *args: str, preexec_fn=None) -> tuple[subprocess.Popen, Path]:
    """The child of shm_child (own session, like the supervisor's children) and its grandchild's segment."""
    name_file = tmp_path / f"shm-{uuid.uuid4().hex[:6]}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.programs.shm_child", str(name_file), *args],
        cwd=ROOT,
        start_new_session=True,
        preexec_fn=preexec_fn,
    )
    deadline = time.time() + 30
    while not name_file.exists():
        assert proc.poll() is None or args, f"shm_child exited with {proc.returncode}"
        assert time.time() < deadline, "the grandchild never created its segment"
        time.sleep(0.05)
    return proc, Path("/dev/shm") / name_file.read_text()


def supervise(tmp_path: Path, proc: subprocess.Popen, role: str = "generator") -> tuple[Supervisor, Child, list[str]]:
    said: list[str] = []
    sup = Supervisor(Config(), tmp_path, "redis://unused", say=said.append)
    child = Child(role, f"{role}-0", proc, tmp_path / f"{role}-0.out", oom_mark=sup.oom.mark())
    sup.children.append(child)
    return sup, child, said


def test_a_killed_trees_segments_are_removed_and_no_others(tmp_path):
    other_job = shared_memory.SharedMemory(create=True, size=1 << 20)  # same psm_ naming, not the tree's
    proc, segment = start_tree(tmp_path)
    try:
        sup, child, said = supervise(tmp_path, proc)
        sup._record_trees()
        assert segment in child.tree.shm and len(child.tree.pids) >= 2  # + its resource tracker
        os.kill(proc.pid, signal.SIGKILL)  # the role process only: its "engine" outlives it, as vLLM's does
        proc.wait(10)
        assert segment.exists()
        sup._on_death(child, proc.returncode)
        assert not segment.exists(), said
        assert Path("/dev/shm", other_job.name).exists()
        assert any("removed 1 shared-memory segment(s) it left in /dev/shm (4 MB" in s for s in said), said
        death = next(s for s in said if "restarting in" in s)
        assert death.startswith("generator-0 (generator) killed by SIGKILL;") and "out of memory" not in death
    finally:
        os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
        other_job.close()
        other_job.unlink()


def test_a_killed_trainer_ends_the_run_naming_the_setting_that_resumes_it(tmp_path):
    """The trainer is not restarted by default (its restart is a resume from its checkpoint): its death
    ends the run with how it died and the setting to change, and still cleans up after its tree."""
    proc, segment = start_tree(tmp_path)
    try:
        sup, child, said = supervise(tmp_path, proc, role="trainer")
        sup._record_trees()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        with pytest.raises(WorkerDied) as died:
            sup._on_death(child, proc.returncode)
        message = str(died.value)
        assert message.startswith("trainer-0 (trainer) killed by SIGKILL;"), message
        assert "supervisor.restart_trainer=true" in message and "out of memory" not in message, message
        assert not segment.exists() and not any("restarting in" in s for s in said), said
    finally:
        os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None


def test_a_segment_still_used_by_a_live_process_is_kept(tmp_path):
    proc, segment = start_tree(tmp_path)
    sup, child, said = supervise(tmp_path, proc)
    sup._record_trees()
    user = shared_memory.SharedMemory(name=segment.name)  # another process of the host maps it too
    try:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        sup._on_death(child, proc.returncode)
        assert segment.exists() and not any("removed" in s for s in said), said
    finally:
        user.close()
        user.unlink()


def _memory_cgroup(tmp_name: str, limit: int) -> Path | None:
    """A fresh memory cgroup (v2 or v1) limited to `limit` bytes, under this process's own; None if not permitted."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, rel = line.split(":", 2)
        if controllers == "":
            base, limit_file = Path("/sys/fs/cgroup") / rel.lstrip("/"), "memory.max"
        elif "memory" in controllers.split(","):
            base, limit_file = Path("/sys/fs/cgroup/memory") / rel.lstrip("/"), "memory.limit_in_bytes"
            base = base if base.is_dir() else Path("/sys/fs/cgroup/memory")  # a cgroup namespace's root is ours
        else:
            continue
        group = base / tmp_name
        try:
            group.mkdir()
            (group / limit_file).write_text(str(limit))
            return group
        except OSError:
            if group.is_dir():
                group.rmdir()
    return None


def test_out_of_memory_is_said_only_for_a_real_oom_kill(tmp_path):
    group = _memory_cgroup(f"streamrl-test-{uuid.uuid4().hex[:6]}", 96 << 20)
    if group is None:
        pytest.skip("cannot create a memory cgroup here (needs root and a writable cgroup fs) to cause a real OOM kill")
    try:
        join = lambda: (group / "cgroup.procs").write_text(str(os.getpid()))  # noqa: E731 - runs in the child
        counter_only = OomWatch(kmsg="/nonexistent", proc_cgroup="/nonexistent")  # where the kernel log is hidden
        mark = counter_only.mark()
        proc, segment = start_tree(tmp_path, "512", preexec_fn=join)
        sup, child, said = supervise(tmp_path, proc)
        sup._record_trees()
        assert proc.wait(60) == -signal.SIGKILL  # the kernel killed the 512 MB process in its 96 MB group
        sup._on_death(child, proc.returncode)
        death = next(s for s in said if "restarting in" in s)
        assert "out of memory" in death and "OOM killer" in death, death
        assert not segment.exists()
        assert counter_only.source[0] == Path("/proc/vmstat")
        assert "likely out of memory: the kernel's OOM killer fired while it ran" in counter_only.evidence(
            {proc.pid}, mark
        )
        assert counter_only.evidence({proc.pid}, counter_only.mark()) == ""
        # The kernel log keeps this kill; a later child handed the same pid and then `kill -9`ed must
        # not read as out of memory: only what was logged after its start counts.
        assert "OOM killer" in sup.oom.evidence({proc.pid}, child.oom_mark)
        assert sup.oom.evidence({proc.pid}, sup.oom.mark()) == ""
    finally:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:  # its processes are still being reaped
                time.sleep(0.1)
