"""The caller's side of one sandboxed run: feed the code on stdin, collect stdout and stderr up to a bound
and until the wall-clock deadline, and kill the whole sandbox. Used by streamrl/envs/sandbox/executor.py.

    out, err, stopped, truncated = pump(proc, code_bytes, limits, start)   # stopped: 'wall', 'output' or None
    kill(proc)
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time


def pump(proc: subprocess.Popen, src: bytes, limits, start: float):
    """Feed the code on stdin and collect stdout/stderr up to the bound, until both close, the deadline
    passes or the output overflows. Returns (stdout, stderr, stop reason or None, truncated)."""
    cap = limits.max_output_bytes
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    sel = selectors.DefaultSelector()
    for f in (proc.stdout, proc.stderr):
        os.set_blocking(f.fileno(), False)
        sel.register(f.fileno(), selectors.EVENT_READ)
    stdin_fd = proc.stdin.fileno()
    os.set_blocking(stdin_fd, False)
    sel.register(stdin_fd, selectors.EVENT_WRITE)
    pending, stopped, truncated = memoryview(src), None, False
    try:
        while sel.get_map():
            left = start + limits.wall_s - time.monotonic()
            if left <= 0:
                stopped = "wall"
                break
            for key, _ in sel.select(timeout=min(left, 1.0)):
                fd = key.fd
                if fd == stdin_fd:
                    try:
                        n = os.write(fd, pending[:65536])
                    except (BrokenPipeError, BlockingIOError) as exc:
                        n = len(pending) if isinstance(exc, BrokenPipeError) else 0
                    pending = pending[n:]
                    if not pending:
                        sel.unregister(fd)
                        proc.stdin.close()
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    sel.unregister(fd)
                    continue
                buf = bufs[fd]
                room = cap - len(buf)
                buf += chunk[: max(room, 0)]
                if len(chunk) > room:
                    stopped, truncated = "output", True
            if stopped:
                break
    finally:
        sel.close()
    return bytes(bufs[proc.stdout.fileno()]), bytes(bufs[proc.stderr.fileno()]), stopped, truncated


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL bwrap's process group; the sandbox's pid 1 dies with it (--die-with-parent) and the
    kernel then kills everything left in the sandbox's pid namespace."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
