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
    generator may have taken the whole admission window before another was up). With `settled`, the
    trainer is held again by `stop_settled`."""
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
            finally:
                if settled is None:
                    os.kill(pid, signal.SIGSTOP)
                else:
                    stop_settled(pid, settled, job_alive)
            since = time.time()
        time.sleep(0.5)


def stop_settled(pid: int, settled, job_alive, timeout: float = 90.0, run_s: float = 0.2, look_s: float = 0.5):
    """SIGSTOP `pid` (the trainer) at a moment `settled()` holds: every generator has loaded the newest
    announced weights version. With weights read from the trainer's memory (mooncake), a generator
    pulling from a stopped trainer waits, engine paused and groups in flight, until it runs again: a
    stop landing mid-pull would hold that generator's groups for the whole hold. So: stop, look after
    `look_s`, and while one lags let the trainer run `run_s` more."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.time() + timeout
    while job_alive() and time.time() < deadline:
        time.sleep(look_s)
        if settled():
            return
        os.kill(pid, signal.SIGCONT)
        time.sleep(run_s)
        os.kill(pid, signal.SIGSTOP)
    if job_alive():  # an ended job is the caller's to report (wait_held names what it was waiting for)
        raise AssertionError(f"the generators did not load the trainer's newest weights within {timeout:g}s")
