"""The bubblewrap command line of one sandboxed Python run: which host paths the sandbox sees (only the
interpreter's runtime, read-only), which namespaces it gets, and the bootstrap that applies the rlimits
inside before the model's code runs. Used by streamrl/envs/sandbox/executor.py; see docs/sandbox.md for the threat model.

    argv = bwrap_argv(limits, scratch=None, seccomp_fd=None)
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import sysconfig
from pathlib import Path

SCRATCH = "/scratch"
"""Where the scratch directory is inside the sandbox (also its HOME, cwd and TMPDIR)."""

PYTHONPATH_DIR = "/opt/pythonpath"
"""limits.python_paths[i] is bound read-only at PYTHONPATH_DIR/i and put on sys.path."""

EXIT_MEMORY = 211
EXIT_PROCESSES = 212
"""Exit codes the bootstrap uses when the code ends on MemoryError / a refused fork, so the caller can name
the limit. Code can exit with them itself: that only mislabels its own failure."""

# Runs inside the sandbox as `python -I -c BOOTSTRAP <limits...>`. The limits are set here, after bwrap
# has built the user namespace, rather than on bwrap itself: RLIMIT_NPROC set before the namespace exists
# would also become the cap on every concurrent sandbox of this uid together (the kernel's per-namespace
# ucounts take the creator's limit as the parent level's maximum). Hard = soft so code cannot raise them.
BOOTSTRAP = r"""
import os, resource, sys, traceback
cpu, mem, nproc, fsize, nofile, drop_to = (int(a) for a in sys.argv[1:7])
extra = sys.argv[7:]
def lim(kind, soft, hard=None):
    resource.setrlimit(kind, (soft, soft if hard is None else hard))
lim(resource.RLIMIT_CPU, cpu, cpu + 1)
if mem > 0:
    lim(resource.RLIMIT_AS, mem)
lim(resource.RLIMIT_NPROC, nproc)
lim(resource.RLIMIT_FSIZE, fsize)
lim(resource.RLIMIT_NOFILE, nofile)
lim(resource.RLIMIT_CORE, 0)
if drop_to:  # root mode (streamrl/envs/sandbox/userns.py): become the unprivileged uid; clears every capability
    os.setgroups([])
    os.setgid(drop_to)
    os.setuid(drop_to)
    if os.getuid() != drop_to or "CapEff:\t0000000000000000" not in open("/proc/self/status").read():
        raise SystemExit("sandbox bootstrap: could not drop privileges; refusing to run the code")
src = sys.stdin.read()
null = os.open("/dev/null", os.O_RDONLY)
os.dup2(null, 0)
os.close(null)
sys.stdin = open(0, closefd=False)
sys.path[:] = [p for p in sys.path if p] + extra
sys.argv = ["main.py"]
g = {"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__}
def _end(code, _exit=os._exit, _tb=traceback):  # bound now: under MemoryError an import can fail
    try:
        _tb.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        _exit(code)
del os, resource, traceback, cpu, mem, nproc, fsize, nofile, drop_to, extra, lim, null
try:
    exec(compile(src, "main.py", "exec"), g)
except MemoryError:
    _end(211)
except BlockingIOError as exc:
    _end(212 if exc.errno == 11 else 1)
"""


def bwrap_path() -> str | None:
    """The bwrap binary: $STREAMRL_BWRAP when set (a bwrap outside PATH), else the one on PATH; None when
    there is none."""
    if "STREAMRL_BWRAP" in os.environ:
        p = os.environ["STREAMRL_BWRAP"]
        return p if os.access(p, os.X_OK) else None
    return shutil.which("bwrap")


def interpreter() -> str:
    """The base interpreter (not the venv's shim: a venv's pyvenv.cfg lives in the repository's .venv,
    which the sandbox must not see)."""
    return os.path.realpath(sys.executable)


def runtime_paths() -> list[str]:
    """Host directories the interpreter needs, bound read-only: the Python prefix (stdlib, lib-dynload)
    and the system library folders its shared objects load from. Nothing else of the host is visible."""
    exe = interpreter()
    paths = {sys.base_prefix, sys.base_exec_prefix, os.path.dirname(exe), sysconfig.get_path("stdlib")}
    for lib in ("/usr/lib", "/usr/lib64", "/usr/lib32", "/usr/local/lib"):
        if os.path.isdir(lib) and not os.path.islink(lib):
            paths.add(lib)
    # Drop folders inside another bound folder (binding both is harmless, but a short list reads better).
    real = sorted({os.path.realpath(p) for p in paths if os.path.isdir(p)})
    return [p for p in real if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in real)]


def _top_links() -> list[str]:
    """Merged-/usr systems have /lib, /lib64, /bin as symlinks into /usr: recreate them (the dynamic
    loader's path, /lib64/ld-linux-x86-64.so.2, goes through one); bind real folders instead."""
    args: list[str] = []
    for top in ("/lib", "/lib64", "/lib32", "/bin"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top) and top != "/bin":
            args += ["--ro-bind", top, top]
    return args


def bwrap_argv(
    limits, scratch: Path | None, seccomp_fd: int | None = None, userns_fd: int | None = None, drop_to: int = 0
) -> list[str]:
    """The full command line: bwrap options, then the interpreter running BOOTSTRAP with the limits.

    `scratch` is a host folder bound read-write at /scratch; None gives a private tmpfs of
    limits.scratch_bytes instead (nothing reaches the host's disk). With `userns_fd` (root mode) bwrap
    runs inside that user namespace, as its uid 0, and the bootstrap switches to `drop_to`; without it
    bwrap makes the user namespace itself and the code runs as uid 65534 mapped to the caller's uid."""
    bwrap = bwrap_path()
    if bwrap is None:
        raise FileNotFoundError("bwrap")
    if userns_fd is None:
        args = [
            bwrap,
            "--unshare-all",
            "--unshare-user",
            "--disable-userns",
            "--cap-drop",
            "ALL",
            "--uid",
            "65534",
            "--gid",
            "65534",
        ]
    else:
        # Nested user namespaces are refused by the seccomp filter (unshare, clone flags) in this mode.
        args = [
            "nsenter",
            f"--user=/proc/self/fd/{userns_fd}",
            bwrap,
            "--unshare-pid",
            "--unshare-net",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--cap-drop",
            "ALL",
            "--cap-add",
            "CAP_SETUID",
            "--cap-add",
            "CAP_SETGID",
        ]
    args += ["--die-with-parent", "--new-session", "--hostname", "sandbox", "--clearenv"]
    paths = runtime_paths()
    # bwrap gives the folders it creates above a bind the host's modes; /root is 0700, which would hide a
    # Python under it (pyenv) from the unprivileged uid. Only the path down to the bind is exposed.
    targets = paths + [f"{PYTHONPATH_DIR}/{i}" for i in range(len(limits.python_paths))]
    above = sorted({str(a) for p in targets for a in Path(p).parents if str(a) != "/"}, key=lambda a: a.count("/"))
    for a in above:
        args += ["--perms", "0755", "--dir", a]
    for p in paths:
        args += ["--ro-bind", p, p]
    args += _top_links()
    args += ["--proc", "/proc", "--dev", "/dev"]
    if scratch is None:
        args += ["--size", str(limits.scratch_bytes), "--perms", "0777", "--tmpfs", SCRATCH]
    else:
        args += ["--bind", str(scratch), SCRATCH]
    args += ["--symlink", SCRATCH, "/tmp", "--chdir", SCRATCH]
    for k, v in {
        "HOME": SCRATCH,
        "TMPDIR": SCRATCH,
        "PATH": f"{os.path.dirname(interpreter())}:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
    }.items():
        args += ["--setenv", k, v]
    # At fixed places, not their host paths: those may lie under /tmp, which is scratch's symlink here.
    for i, p in enumerate(limits.python_paths):
        args += ["--ro-bind", os.path.realpath(p), f"{PYTHONPATH_DIR}/{i}"]
    # The root and /dev are bwrap's own tmpfs mounts, without a size bound: read-only, so the only writable
    # space is the bounded scratch folder (and the ro runtime binds stay as they are).
    args += ["--remount-ro", "/dev", "--remount-ro", "/"]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    mem = limits.memory_bytes or 0
    # +1 where bwrap's init inside runs as the same uid in the same namespace (not in root mode: it is uid 0).
    nproc = limits.processes + (0 if drop_to else 1)
    args += [
        "--",
        interpreter(),
        "-I",
        "-B",
        "-u",
        "-c",
        BOOTSTRAP,
        str(math.ceil(limits.cpu_s)),
        str(mem),
        str(nproc),
        str(limits.file_bytes),
        str(limits.open_files),
        str(drop_to),
    ]
    args += [f"{PYTHONPATH_DIR}/{i}" for i in range(len(limits.python_paths))]
    return args
