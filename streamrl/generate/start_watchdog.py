"""The start-up watchdog of a vLLM engine: a start that has not finished within its start_timeout_s
has its stacks dumped to the log, its processes killed, and this process exits naming the phase it
hung in (exit EXIT_ENGINE_START_HUNG: `streamrl up` restarts it with spawn, never fork).

A thread, not an asyncio timeout: the start blocks the event loop's thread inside vLLM (the
EngineCore's handshake), so no coroutine would run. The dump: this process's Python stacks
(faulthandler), then every process's native and Python stacks by `py-spy dump --native` (gdb where
py-spy is missing). A forked EngineCore deadlocked in GNU OpenMP hung at start-up with nothing logged
for minutes before this existed (issue 46).

    with StartWatchdog(gen.start_timeout_s, "generator.start_timeout_s") as watch:
        watch.phase = "building the engine config"
        ...
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import structlog

from streamrl.core.errors import ENGINE_HUNG_PREFIX, EXIT_ENGINE_START_HUNG


def _log():
    """Bound at the call, not at import: a logger bound before setup_logging never reaches RUN_DIR/logs."""
    return structlog.get_logger("streamrl").bind(component="start_watchdog")


DUMP_TIMEOUT_S = 60.0
"""How long one process's stack dump may take (py-spy symbolizes torch's libraries: a few seconds)."""
FRAME = re.compile(r"^\s+(\S+) \(([^()]*\.py):(\d+)\)")
"""A Python frame line of `py-spy dump`: `    __init__ (vllm/v1/utils.py:120)`."""


def stack_dumper() -> list[str] | None:
    """The command (without the pid) that prints a process's native and Python stacks, or None."""
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy:
        return [spy, "dump", "--native", "--pid"]
    if gdb := shutil.which("gdb"):
        return [gdb, "-batch", "-ex", "thread apply all bt", "-p"]
    return None


def dump_stacks(pid: int) -> str:
    """The native and Python stacks of process `pid` as text, or why there are none."""
    cmd = stack_dumper()
    if cmd is None:
        return f"(no stacks of pid {pid}: install py-spy (pip install py-spy) or gdb)"
    try:
        out = subprocess.run([*cmd, str(pid)], capture_output=True, text=True, timeout=DUMP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(no stacks of pid {pid}: {type(exc).__name__}: {exc})"
    return (out.stdout + out.stderr).strip()


def innermost_frame(dump: str) -> str:
    """The innermost Python frame of the first thread in a py-spy dump, `func (file.py:line)`; "" if none."""
    for line in dump.splitlines():
        if m := FRAME.match(line):
            return f"{m.group(1)} ({m.group(2)}:{m.group(3)})"
    return ""


def engine_processes() -> list[int]:
    """The processes this one started (a vLLM EngineCore and its workers)."""
    import psutil

    return [p.pid for p in psutil.Process().children(recursive=True)]


def _allow_tracing_by_children() -> None:
    """Under Yama ptrace_scope=1 a process may only trace its descendants; the dumper is a child of
    this process tracing it (prctl PR_SET_PTRACER_ANY). A no-op without Yama."""
    try:
        ctypes.CDLL(None).prctl(0x59616D61, ctypes.c_ulong(2**64 - 1), 0, 0, 0)
    except (OSError, AttributeError):
        pass


class StartWatchdog:
    def __init__(self, timeout_s: float, setting: str, exit_process=os._exit):
        self.timeout_s = timeout_s
        self.setting = setting
        """The config field that sets the timeout (named in the exit message)."""
        self.phase = "starting"
        """What the start is doing now, set by the caller as it goes; named when it hangs."""
        self.exit_process = exit_process
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "StartWatchdog":
        self._thread = threading.Thread(target=self._watch, name="engine-start-watchdog", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()

    def _watch(self) -> None:
        if not self._done.wait(self.timeout_s):
            self.fire()

    def fire(self) -> None:
        """Dump, kill, exit: the start hung. The exit happens whatever the dump runs into."""
        phase, where = self.phase, []
        err = sys.stderr
        try:
            print(
                f"--- vLLM engine start hung for {self.timeout_s:g}s in: {phase}; stacks follow ---",
                file=err,
                flush=True,
            )
            faulthandler.dump_traceback(file=err, all_threads=True)
            _allow_tracing_by_children()
            for pid in [os.getpid(), *engine_processes()]:
                dump = dump_stacks(pid)
                print(f"--- native and Python stacks of pid {pid} ---\n{dump}", file=err, flush=True)
                if pid != os.getpid() and (frame := innermost_frame(dump)):
                    where.append(f"pid {pid} in {frame}")
            _log().error("engine_start_hung", phase=phase, timeout_s=self.timeout_s, engine_processes=where)
        except Exception as exc:  # e.g. a stderr without a file descriptor: still kill and exit
            print(f"(stack dump failed: {exc!r})", file=err, flush=True)
        finally:
            for pid in engine_processes():
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
            print(ENGINE_HUNG_PREFIX + hang_message(phase, self.timeout_s, self.setting, where), file=err, flush=True)
            self.exit_process(EXIT_ENGINE_START_HUNG)


def hang_message(phase: str, timeout_s: float, setting: str, where: list[str]) -> str:
    """The one line naming where the start hung and what happens next; pure."""
    inside = f" ({'; '.join(where)})" if where else ""
    return (
        f"the vLLM engine did not start within {setting}={timeout_s:g}s; it hung while {phase}{inside}. "
        "Its stacks are in this log above. Exiting so that `streamrl up` restarts this role with the "
        f"engine started by spawn; raise {setting} if this model legitimately starts slower"
    )
