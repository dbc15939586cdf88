"""Hold a role's process still (SIGSTOP ... SIGCONT) while a test looks at a live job.

A tiny CPU job trains a step in well under a second once its generators run, so a test that must see
the job running (a `streamrl status` while every worker is up, a SIGKILL mid-run) cannot rely on steps
to spare: the job may end while the check is still starting. Holding the trainer keeps the job alive
for as long as the check takes; the other roles go on (generators fill the admission window, reward
workers score it), and the run finishes normally once the trainer is let go.
"""

from __future__ import annotations

import json
import os
import signal
import time
from contextlib import contextmanager

import redis

SETTLE_S = 30.0


def worker_pid(client: redis.Redis, run: str, role: str, worker_id: str) -> int:
    """The pid in a worker's heartbeat (docs/protocol.md, "Other keys")."""
    raw = client.get(f"streamrl:{run}:workers:{role}:{worker_id}")
    assert raw, f"no heartbeat for {role} {worker_id} of run {run}"
    return int(json.loads(raw)["pid"])


@contextmanager
def held(pid: int):
    """SIGSTOP `pid` for the block; SIGCONT after it, also when the block fails."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def wait_held(what: str, cond, pid: int, steps, job_alive, timeout: float = 400, idle_s: float = 15.0, settled=None):
    """Wait for `cond()` while `pid` (the trainer) is held; if it has not come true after `idle_s`, let
    the trainer take one step (SIGCONT until `steps()` grows, then SIGSTOP again) and go on waiting.
    The step frees admission slots, so a worker that the held job left without work gets some (one
    generator may have taken the whole admission window before another was up). `settled()`, where
    given, must also come true (at most SETTLE_S) before the trainer is held again: with weights read
    from the trainer's memory (mooncake), a generator that pulls the step's version from a stopped
    trainer waits, paused, with its groups in flight, until the trainer runs again."""
    deadline = time.time() + timeout
    since = time.time()
    while not cond():
        assert job_alive(), f"the job ended before {what}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        if time.time() - since > idle_s:
            before = steps()
            os.kill(pid, signal.SIGCONT)
            try:
                while steps() <= before and time.time() < deadline and job_alive():
                    time.sleep(0.1)
                settle_by = time.time() + SETTLE_S
                while settled is not None and not settled() and time.time() < settle_by and job_alive():
                    time.sleep(0.1)
            finally:
                os.kill(pid, signal.SIGSTOP)
            since = time.time()
        time.sleep(0.5)
