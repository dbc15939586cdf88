"""A second SIGTERM ends a role whose stop hangs: it logs what the stop waited on and takes its
child processes (vLLM's EngineCore, for a generator) with it instead of orphaning them."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[3]


def test_second_signal_exits_at_once_and_kills_the_children(redis_server, tmp_path):
    pidfile = tmp_path / "child.pid"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.programs.stuck_worker", redis_server.url, str(pidfile)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 60
    while not pidfile.exists() or not pidfile.read_text():
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read() if proc.poll() is not None else ""
        time.sleep(0.1)
    child = psutil.Process(int(pidfile.read_text()))  # written in start(): signal handlers are installed
    proc.send_signal(signal.SIGTERM)
    time.sleep(1.5)  # longer than the worker's stop budget: stop_slow is logged
    assert proc.poll() is None  # the first signal only asks; close() hangs
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130, out
    assert "stop_slow" in out and "forced_exit" in out, out
    assert "StuckWorker.close" in out, out  # the hung coroutine is named in the task stacks
    child.wait(timeout=10)  # reaped by init once killed; raises TimeoutExpired if still running
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
