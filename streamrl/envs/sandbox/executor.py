"""Run model-written Python isolated from the host: the `python` tool's executor.

    from streamrl.envs.sandbox.executor import run_python, SandboxLimits
    res = run_python("print(2 + 2)")                      # SandboxResult(stdout='4\n', exit_code=0, ...)
    res = run_python(code, SandboxLimits(wall_s=5, memory_bytes=256 << 20))
    res = await run_python_async(code)                    # same, off the event loop

Each call is a fresh bubblewrap sandbox (streamrl/envs/sandbox/bwrap.py: new user, mount, pid, net, ipc, uts
namespaces; only the interpreter's runtime visible, read-only; a private scratch folder; no network), run as
an unprivileged uid without capabilities (as root too: streamrl/envs/sandbox/userns.py), under a seccomp filter
(streamrl/envs/sandbox/seccomp.py), rlimits on CPU, address space, processes, file size and open files set
inside it, a per-call cgroup where one can be made (streamrl/envs/sandbox/cgroup.py), and a wall-clock deadline
and an output bound enforced from here. Safe to call from many threads at once (no preexec_fn, no shared
state). Without bubblewrap it refuses (SandboxUnavailable names the fix) instead of running code unsandboxed.
What it does and does not protect against: docs/sandbox.md.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from streamrl.core.errors import ConfigError, StreamRLError
from streamrl.envs.sandbox.bwrap import EXIT_MEMORY, EXIT_PROCESSES, bwrap_argv, bwrap_path
from streamrl.envs.sandbox.cgroup import SandboxCgroup
from streamrl.envs.sandbox.pump import kill, pump
from streamrl.envs.sandbox.seccomp import seccomp_program
from streamrl.envs.sandbox.userns import SANDBOX_UID, UsernsError, root_userns, tools_missing

INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: `apt-get install -y bubblewrap`; Fedora: `dnf install bubblewrap`) "
    "and allow user namespaces (sysctl kernel.unprivileged_userns_clone=1 / "
    "user.max_user_namespaces > 0; in Docker run with --security-opt seccomp=unconfined or use "
    "--privileged)"
)


class SandboxUnavailable(StreamRLError, RuntimeError):
    """The sandbox cannot be built on this machine; nothing was run."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-call bounds. Every field is enforced by the kernel (rlimits, namespaces) except wall_s and
    max_output_bytes, which this process enforces by killing the sandbox."""

    wall_s: float = 10.0
    """Wall-clock seconds before the whole sandbox is killed (reason 'wall')."""
    cpu_s: float = 5
    """CPU seconds per process, rounded up (RLIMIT_CPU; SIGXCPU then SIGKILL: reason 'cpu')."""
    memory_bytes: int | None = 512 << 20
    """Address space per process (RLIMIT_AS), and all processes together where a memory cgroup can be made;
    None: unbounded. A MemoryError or the cgroup's OOM kill gives reason 'memory'."""
    processes: int = 32
    """Processes and threads the code may hold at once, its interpreter's main thread included
    (RLIMIT_NPROC in the call's own user namespace, and a pids cgroup where one can be made)."""
    file_bytes: int = 16 << 20
    """Largest file the code may write (RLIMIT_FSIZE)."""
    open_files: int = 64
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    scratch_bytes: int = 64 << 20
    """Size of the private tmpfs scratch folder (when run_python gets no `scratch`)."""
    max_output_bytes: int = 64 << 10
    """Bound on stdout and on stderr each: more than this and the sandbox is killed (reason 'output');
    the result keeps the first max_output_bytes of each."""
    python_paths: tuple[str, ...] = ()
    """Extra host folders (e.g. a site-packages with numpy) bound read-only and put on sys.path."""

    def __post_init__(self):
        low = {
            "wall_s": 0.1,
            "cpu_s": 1,
            "processes": 1,
            "file_bytes": 1,
            "open_files": 16,
            "scratch_bytes": 1 << 20,
            "max_output_bytes": 1,
        }
        for name, least in low.items():
            if not getattr(self, name) >= least:
                raise ConfigError(f"sandbox limit {name}={getattr(self, name)!r} is below {least}; raise it")
        if self.memory_bytes is not None and self.memory_bytes < 64 << 20:
            raise ConfigError(
                f"sandbox limit memory_bytes={self.memory_bytes} is below 64 MiB, too little for the "
                "interpreter itself; raise it (or None for no bound)"
            )
        for p in self.python_paths:
            if not os.path.isdir(p):
                raise ConfigError(f"sandbox python_paths entry {p!r} is not a folder; give existing folders")
        object.__setattr__(self, "python_paths", tuple(self.python_paths))


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int
    """The code's exit status; 128+N: it died of signal N; negative: the sandbox was killed from here
    (wall or output bound)."""
    timed_out: bool = False
    reason: str | None = None
    """Why it was stopped or failed, when a limit did it: 'wall', 'cpu', 'memory', 'processes', 'output',
    'signal' (killed by another signal); None for a normal exit (any exit code)."""
    truncated: bool = False
    duration_s: float = 0.0
    limits: SandboxLimits = field(default_factory=SandboxLimits, repr=False)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.reason is None


def sandbox_problem() -> str | None:
    """None when a sandbox can be built here (a trivial run succeeds); else what is wrong and the fix."""
    if bwrap_path() is None:
        return _missing()
    try:
        res = _run("print(1)", SandboxLimits(wall_s=20), None)
    except SandboxUnavailable as exc:
        return str(exc)
    except OSError as exc:
        return f"bubblewrap could not be started ({exc}); {INSTALL_HINT}"
    if res.stdout.strip() != "1":
        detail = (res.stderr.strip().splitlines() or [f"exit code {res.exit_code}"])[-1]
        return f"bubblewrap is installed but cannot build the sandbox here ({detail}); {INSTALL_HINT}"
    return None


def _missing() -> str:
    where = (
        f"$STREAMRL_BWRAP={os.environ['STREAMRL_BWRAP']!r} is not executable"
        if "STREAMRL_BWRAP" in os.environ
        else "bwrap is not on PATH"
    )
    return f"the sandboxed python tool needs bubblewrap, and {where}; {INSTALL_HINT}"


def run_python(code: str, limits: SandboxLimits | None = None, scratch: str | Path | None = None) -> SandboxResult:
    """Run `code` in a fresh sandbox and return what it printed and how it ended; never raises for
    anything the code does. `scratch`: a host folder to bind read-write at /scratch (kept across calls,
    e.g. one per episode); default a private tmpfs that vanishes with the sandbox."""
    limits = limits or SandboxLimits()
    if bwrap_path() is None:
        raise SandboxUnavailable(_missing())
    return _run(code, limits, Path(scratch) if scratch is not None else None)


async def run_python_async(
    code: str, limits: SandboxLimits | None = None, scratch: str | Path | None = None
) -> SandboxResult:
    """run_python in a worker thread, so an event loop keeps serving other steps while the code runs."""
    return await asyncio.to_thread(run_python, code, limits, scratch)


def _run(code: str, limits: SandboxLimits, scratch: Path | None, cgroup: bool = True) -> SandboxResult:
    """One sandboxed run. cgroup=False skips the per-run cgroup (tests use it to exercise the limits of
    machines without a writable one)."""
    start = time.monotonic()
    # +2: the cgroup also holds bwrap and the sandbox's init (the shell that joins it execs bwrap).
    cg = SandboxCgroup.create(limits.processes + 2, limits.memory_bytes) if cgroup else None
    try:
        proc = _launch(limits, scratch, cg)
    except BaseException:
        if cg is not None:
            cg.destroy()
        raise
    try:
        out, err, stopped, truncated = pump(proc, code.encode("utf-8", "replace"), limits, start)
        if stopped is None:  # both pipes closed: the code is ending (or closed them and runs on)
            try:
                proc.wait(timeout=max(start + limits.wall_s - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                stopped = "wall"
    finally:
        kill(proc)
        for f in (proc.stdin, proc.stdout, proc.stderr):
            if f is not None:
                f.close()
        rc = proc.wait()
        events = cg.events() if cg else {}
        if cg is not None:
            cg.destroy()
    reason = stopped or _reason(rc)
    if stopped is None and events.get("oom_kill"):
        reason = "memory"
    elif reason is None and rc != 0 and events.get("pids_max"):
        reason = "processes"
    return SandboxResult(
        stdout=out.decode("utf-8", "replace"),
        stderr=err.decode("utf-8", "replace"),
        exit_code=rc,
        timed_out=stopped == "wall",
        reason=reason,
        truncated=truncated,
        duration_s=time.monotonic() - start,
        limits=limits,
    )


def _launch(limits: SandboxLimits, scratch: Path | None, cg: SandboxCgroup | None) -> subprocess.Popen:
    """Start bwrap with the seccomp filter on a pipe and, as root, inside a fresh user namespace that lets
    the bootstrap drop to an unprivileged host uid (streamrl/envs/sandbox/userns.py says why)."""
    root = os.geteuid() == 0
    program = seccomp_program()
    if root and (program is None or tools_missing()):
        why = tools_missing() or f"no seccomp table for {os.uname().machine}"
        raise SandboxUnavailable(
            f"running as root, the sandbox needs its own user namespace and seccomp filter, "
            f"but: {why}; install util-linux (unshare, nsenter), or run streamrl as a "
            "non-root user"
        )
    if root and scratch is not None:
        os.chown(scratch, SANDBOX_UID, SANDBOX_UID)  # the code runs as that uid; it must write its scratch
    fds: list[int] = []
    try:
        if program is not None:
            read_fd, write_fd = os.pipe()
            fds.append(read_fd)
            try:
                os.write(write_fd, program)  # a few hundred bytes: fits the pipe's buffer, bwrap reads it later
            finally:
                os.close(write_fd)
        userns_fd = root_userns() if root else None
        if userns_fd is not None:
            fds.append(userns_fd)
        argv = bwrap_argv(
            limits,
            scratch,
            seccomp_fd=fds[0] if program is not None else None,
            userns_fd=userns_fd,
            drop_to=SANDBOX_UID if root else 0,
        )
        return subprocess.Popen(
            cg.wrap(argv) if cg else argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
            pass_fds=tuple(fds),
        )
    except UsernsError as exc:
        raise SandboxUnavailable(
            f"running as root, the sandbox needs its own user namespace: {exc}; {INSTALL_HINT}"
        ) from None
    finally:
        for fd in fds:  # the child has its copies (or never started)
            os.close(fd)


def _reason(rc: int) -> str | None:
    """The limit an exit status means. bwrap's init reports a child killed by signal N as 128+N."""
    if rc == EXIT_MEMORY:
        return "memory"
    if rc == EXIT_PROCESSES:
        return "processes"
    if rc in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        return "cpu"
    # Other signals, SIGKILL included: the kernel's OOM killer (named 'memory' by the cgroup's events, where
    # there is one), the CPU hard limit a second after the soft one (code that ignores SIGXCPU), the code's own.
    if rc < 0 or rc > 128:
        return "signal"
    return None
