"""`weights.backend: torchstore` between independently started processes (the torchstore extra; real
redis-server, real Monarch actors, real processes: bench/weights_torchstore.py's `publish` and `read`
entry points, i.e. a TorchStorePublisher and a TorchStoreLoader from make_loader, each in its own
interpreter). Across two network namespaces: test_torchstore_netns.py.

    pytest tests/integration/weights/test_torchstore_processes.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid

import pytest

from bench.weights_torchstore import ROOT, argv, next_event

pytest.importorskip("torchstore", reason="the torchstore extra is not installed (make setup installs it)")

SIZE, TENSOR = 1 << 20, 1 << 18
"""1 MiB state dicts in four tensors (each tensor's fill says its version: a mix would show)."""


def _start(args: list[str], stdin: bool = False) -> subprocess.Popen:
    return subprocess.Popen(
        args,
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
        cwd=ROOT,
        start_new_session=True,
    )


def _publish(pub: subprocess.Popen, version: int, deadline: float) -> dict:
    pub.stdin.write(f"{version}\n")
    return next_event(pub, "published", deadline)


def _stop(*procs: subprocess.Popen | None) -> None:
    for proc in procs:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


@pytest.mark.timeout(240)
def test_a_reader_started_later_reads_the_newest_then_follows_across_a_trainer_restart(redis_server):
    run = f"ts-procs-{uuid.uuid4().hex[:6]}"
    url = redis_server.url
    deadline = time.monotonic() + 200
    publisher = argv("publish", url, run, "127.0.0.1", bytes=SIZE, tensor_bytes=TENSOR)
    # All three start now (their imports take seconds); each touches the broker and Monarch only when
    # told: the publishers at their first version, the reader at "go".
    pub, pub2 = _start(publisher, stdin=True), _start(publisher, stdin=True)
    reader = _start(argv("read", url, run, "127.0.0.1", versions=3, wait_stdin=True), stdin=True)
    try:
        for proc in (pub, pub2):
            next_event(proc, "started", deadline)
        for v in (1, 2, 3):
            assert _publish(pub, v, deadline)["bytes"] == SIZE
        # Late join: a reader that joins after three versions gets the newest, not the first.
        next_event(reader, "waiting", deadline)
        reader.stdin.write("go\n")
        assert next_event(reader, "ready", deadline)["version"] == 3  # `read` checks every tensor's fill
        _publish(pub, 4, deadline)
        got = next_event(reader, "ready", deadline)
        assert (got["version"], got["bytes"]) == (4, SIZE)
        # The trainer restarts (a new store, a new controller reference in the broker): the same reader
        # rebuilds its client and reads the restarted trainer's next version.
        _stop(pub)
        _publish(pub2, 5, deadline)
        assert next_event(reader, "ready", deadline)["version"] == 5
        assert reader.wait(timeout=60) == 0
    finally:
        _stop(reader, pub, pub2)
