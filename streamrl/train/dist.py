"""Rank launching for the trainer: one torch.distributed process group, gloo on CPU, NCCL on GPU.

    launch(2, functools.partial(train_main, cfg))     # spawns 2 local ranks, each calls fn(rank, world)
    torchrun --nproc-per-node 8 -m streamrl.cli worker trainer ...   # RANK/WORLD_SIZE set: no spawning

`fn` must be picklable (a module-level function, or functools.partial of one) because local ranks
are started with the `spawn` method: fork is unsafe once torch has started its thread pools.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from streamrl.core.errors import ConfigError, FatalError, StreamRLError

DEFAULT_TIMEOUT = timedelta(minutes=10)
"""How long a collective waits for a missing rank before the group raises (instead of hanging)."""


class RankFailed(StreamRLError, RuntimeError):
    """A trainer rank raised or died; the message names the rank and its error."""

    def __init__(self, rank: int, detail: str):
        super().__init__(f"trainer rank {rank} failed: {detail}")
        self.rank = rank


def default_backend() -> str:
    """gloo for CPU tensors, plus NCCL for CUDA tensors where a GPU exists (one group serves both)."""
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def broadcast_object(obj):
    """Rank 0's `obj` on every rank (pickled over the trainer's own process group, never the wire).
    The one collective of the trainer's rank step: its shape (one object) is known on every rank."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _init_group(rank: int, world: int, backend: str | None, init_method: str) -> None:
    if torch.cuda.is_available():
        # One GPU per local rank; NCCL collectives run on the current device.
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    dist.init_process_group(
        backend or default_backend(), init_method=init_method, rank=rank, world_size=world, timeout=DEFAULT_TIMEOUT
    )


def _run(
    rank: int, world: int, fn: Callable[[int, int], None], backend: str | None, init_method: str, torchrun: bool = False
) -> None:
    if rank > 0 and threading.current_thread() is threading.main_thread():
        _leave_stops_to_rank0(torchrun)
    _init_group(rank, world, backend, init_method)
    try:
        fn(rank, world)
    except BaseException:
        # A spawned rank exits without tearing the group down: destroying it first would make the
        # healthy ranks fail (and record their errors) before this rank's error is recorded.
        if world == 1:
            dist.destroy_process_group()
        raise
    dist.destroy_process_group()


def _leave_stops_to_rank0(torchrun: bool) -> None:
    """Ranks > 0: rank 0 orders every stop (its last orders are the stop checkpoint's collectives); a rank
    that left on a signal of its own would leave rank 0 alone in them. A terminal's Ctrl-C reaches every
    rank, torch's spawn sends SIGINT to ranks whose launcher died, and torchrun passes the SIGINT or
    SIGTERM it gets to every rank (and SIGKILLs them after its shutdown timeout, 30 s). A spawned rank
    keeps SIGTERM: launch's cleanup after a failed rank ends the others with it. (SFT sets its own.)"""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if torchrun:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _child(
    rank: int, world: int, fn: Callable[[int, int], None], backend: str | None, port: int, report_dir: str
) -> None:
    # Env vars as torchrun would set them, so code inside fn can read them the same way.
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
    )
    try:
        _run(rank, world, fn, backend, "env://")
    except Exception as exc:
        # When one rank fails the others soon fail too ("Connection closed by peer"); a precise
        # timestamp lets the parent name the rank that failed first (file mtimes are too coarse).
        record = {
            "t": time.time_ns(),
            "trace": traceback.format_exc(),
            "fatal": str(exc) if isinstance(exc, FatalError) else None,
        }
        Path(report_dir, f"{rank}.json").write_text(json.dumps(record))
        raise


def launch(world_size: int, fn: Callable[[int, int], None], backend: str | None = None) -> None:
    """Run fn(rank, world) on every rank of a fresh process group; raise RankFailed if any rank fails.

    Under torchrun (RANK and WORLD_SIZE set) this process is one rank: init the group and call fn.
    Otherwise world_size 1 runs in this process (still a 1-rank group, so FSDP runs the same code)
    and world_size > 1 spawns that many local ranks on 127.0.0.1 with a free port; this process then
    passes a stop signal to rank 0, which orders every rank's stop, and stays until they have ended.
    """
    if world_size < 1:
        raise ConfigError(f"world_size={world_size}; set trainer.world_size to 1 or more")
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if world != world_size:
            raise ConfigError(
                f"torchrun started {world} ranks but trainer.world_size={world_size}; "
                f"set trainer.world_size={world} or change torchrun's --nproc-per-node/--nnodes"
            )
        _run(rank, world, fn, backend, "env://", torchrun=True)
        return
    if world_size == 1:
        try:
            _run(0, 1, fn, backend, f"tcp://127.0.0.1:{free_port()}")
        except FatalError:
            raise  # the role's own verdict (do not restart): keep its type for streamrl.launch.runtime
        except Exception as exc:
            raise RankFailed(0, f"{type(exc).__name__}: {exc}") from exc
        return
    report_dir = tempfile.mkdtemp(prefix="streamrl-ranks-")
    ctx = mp.start_processes(
        _child,
        args=(world_size, fn, backend, free_port(), report_dir),
        nprocs=world_size,
        join=False,
        start_method="spawn",
    )
    with _StopForwarder(ctx.processes[0]) as stops:
        try:
            # join() returns False while ranks run; on the first failure it terminates the others.
            while not ctx.join():
                pass
        except mp.ProcessExitedException as exc:
            if stops.forwarded and exc.error_index == 0 and exc.signal_name == "SIGTERM":
                return  # stopped before rank 0 handled signals (still starting): nothing trained to save
            if exc.signal_name not in (None, "SIGTERM"):
                hint = " (SIGKILL usually means out of memory)" if exc.signal_name == "SIGKILL" else ""
                raise RankFailed(exc.error_index, f"killed by {exc.signal_name}{hint}") from None
            raise _first_failure(report_dir) or RankFailed(exc.error_index, f"exit code {exc.exit_code}") from None
        except mp.ProcessRaisedException as exc:
            raise _first_failure(report_dir) or RankFailed(exc.error_index, str(exc).strip()) from None
        finally:
            shutil.rmtree(report_dir, ignore_errors=True)
            for path in ctx.error_files:  # torch.multiprocessing leaves these in /tmp
                if os.path.exists(path):
                    os.unlink(path)


class _StopForwarder:
    """While the spawned ranks run, a stop signal to this process goes to rank 0 as SIGTERM, and this
    process stays to join them. `streamrl up` stops a role with SIGTERM to its pid; were the launcher to
    die of it, the ranks would get torch's parent-death SIGINT and the supervisor would SIGKILL the
    process group once the other roles had stopped: often before rank 0's stop checkpoint.
    A SIGINT from this process's terminal is not passed on: that Ctrl-C reached every rank already."""

    def __init__(self, rank0: mp.Process):
        self.rank0 = rank0
        self.forwarded = 0
        """Signals passed on to rank 0 (a second one makes it exit at once: streamrl.launch.runtime)."""
        self._old: dict = {}

    def __enter__(self) -> _StopForwarder:
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._forward) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *_exc) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)

    def _forward(self, signum: int, _frame) -> None:
        if signum == signal.SIGINT and _terminal_foreground():
            return
        self.forwarded += 1
        if self.rank0.is_alive():
            os.kill(self.rank0.pid, signal.SIGTERM)


def _terminal_foreground() -> bool:
    """Whether this process group is its terminal's foreground group (a Ctrl-C there signals all of it)."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY)
    except OSError:
        return False  # no controlling terminal (e.g. a role `streamrl up` started): only `kill` sends it
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


def _first_failure(report_dir: str) -> RankFailed | FatalError | None:
    """The rank that raised first, with its traceback and the ranks that failed after it (its
    FatalError as such, so the trainer exits with EXIT_NO_RESTART)."""
    records = sorted((json.loads(p.read_text())["t"], int(p.stem), p) for p in Path(report_dir).glob("*.json"))
    if not records:
        return None
    _, rank, path = records[0]
    if fatal := json.loads(path.read_text()).get("fatal"):
        return FatalError(f"trainer rank {rank}: {fatal}")
    others = ", ".join(str(r) for _, r, _ in records[1:])
    tail = f"\n(rank(s) {others} failed after it)" if others else ""
    return RankFailed(rank, json.loads(path.read_text())["trace"].strip() + tail)
