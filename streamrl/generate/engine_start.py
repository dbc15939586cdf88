"""How a vLLM EngineCore process is started: fork where that is safe, spawn where it is not.

Forking keeps the start cheap (the child inherits the imported torch + vLLM instead of importing them
again: ~25 s on the H200, 5-20 s on the CPU VM), but a forked child inherits only the forking thread.
GNU OpenMP (the libgomp torch ships) keeps the worker threads of a thread's first parallel region
in a pool of that thread; a child forked after a multi-threaded torch op (a model built or loaded,
any warm-up) inherits the pool's bookkeeping but not its threads, and its first parallel region (the
EngineCore's first torch.zeros) waits for them forever (issue 46). Counting Python threads does not
see them. So before every fork the forking thread's pool is released with OpenMP 5.0's
omp_pause_resource_all (its threads exit; the next parallel region starts new ones), and `auto`
spawns where a loaded libgomp lacks that call.

    method = choose_start_method(cfg.generator.engine_start_method, cpu=True)  # sets VLLM_WORKER_MULTIPROC_METHOD
    release_openmp_at_fork()                                                  # once per process
"""

from __future__ import annotations

import ctypes
import os
import threading

import structlog


def _log():
    """Bound at the call, not at import: a logger bound before setup_logging never reaches RUN_DIR/logs."""
    return structlog.get_logger("streamrl").bind(component="engine_start")


OMP_PAUSE_HARD = 2
"""omp_pause_hard (OpenMP 5.0): free every resource, the thread pool included."""
OPENMP_LIBS = ("libgomp", "libiomp", "libomp")
"""OpenMP runtimes that may be loaded (torch's Linux wheels bundle libgomp; vLLM suggests libiomp)."""
ENV = "VLLM_WORKER_MULTIPROC_METHOD"

released = {"forks": 0, "threads": 0, "failed": 0}
"""What the at-fork release did in this process: forks seen, OpenMP threads released, failed calls."""
_HOOKED: list[bool] = []


def openmp_runtimes() -> list[str]:
    """Paths of the OpenMP runtimes loaded in this process (from /proc/self/maps; [] elsewhere)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/lib" in line and ".so" in line}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.basename(p).startswith(OPENMP_LIBS))


def _pause_call(path: str):
    """omp_pause_resource_all of a loaded runtime, or None when it has none (libgomp before GCC 9)."""
    try:
        fn = ctypes.CDLL(path).omp_pause_resource_all
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    return fn


def unreleasable_openmp() -> list[str]:
    """Loaded GNU OpenMP runtimes whose pool cannot be released before a fork (no pause call): a forked
    child of a thread that ran a parallel region there may hang. [] when forking is safe on this count.
    (LLVM's and Intel's runtimes reset themselves in a forked child, so only libgomp counts.)"""
    return [p for p in openmp_runtimes() if os.path.basename(p).startswith("libgomp") and _pause_call(p) is None]


def _native_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def release_openmp_pool() -> int:
    """Release the calling thread's OpenMP pool in every loaded runtime; the number of threads that
    ended (0 when none ran). Cheap: a thread pool is started again by the next parallel region."""
    before = _native_threads()
    for path in openmp_runtimes():
        fn = _pause_call(path)
        if fn is not None and fn(OMP_PAUSE_HARD) != 0:  # nonzero only inside a parallel region
            released["failed"] += 1
    return max(0, before - _native_threads())


def _before_fork() -> None:
    released["forks"] += 1
    released["threads"] += release_openmp_pool()


def release_openmp_at_fork() -> None:
    """From now on every os.fork() of this process (vLLM's EngineCore start, multiprocessing) first
    releases the forking thread's OpenMP pool. At the fork, not before the start: vLLM's own start-up
    may run a parallel region between the two. A forked child inherits the hook."""
    if not _HOOKED:
        os.register_at_fork(before=_before_fork)
        _HOOKED.append(True)


def choose_start_method(setting: str, cpu: bool, threads: int | None = None) -> str:
    """Set VLLM_WORKER_MULTIPROC_METHOD (how vLLM starts its EngineCore) from
    generator.engine_start_method unless the environment already names one (`streamrl up` sets spawn
    for a role whose engine start hung); "auto-fork" when auto chose fork (a failed start is then
    retried with spawn). `threads`: this process's Python threads (default: counted now); on the CPU
    build auto forks only a single-threaded process (a thread holding a lock at the fork would leave
    the child's copy locked forever). Anywhere, auto spawns where a loaded libgomp's pool cannot be
    released before the fork. vLLM itself switches to spawn when torch has initialised CUDA here."""
    if ENV in os.environ:
        return os.environ[ENV]
    threads = threading.active_count() if threads is None else threads
    chosen = setting
    if setting == "auto":
        stuck = unreleasable_openmp()
        chosen = "spawn" if (cpu and threads > 1) or stuck else "fork"
        if stuck:
            _log().warning("engine_spawned_openmp", reason="this OpenMP runtime cannot release its threads", libs=stuck)
    os.environ[ENV] = chosen
    return "auto-fork" if setting == "auto" and chosen == "fork" else chosen
