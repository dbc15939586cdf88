"""The console between starting the roles and the first step (streamrl/launch/startup_watch.py):
roles' readiness read from their structured logs as they are written, and who is still starting."""

from __future__ import annotations

import json
import time

from streamrl.launch.startup_watch import StartupWatch


def _log(path, **rec):
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")


def test_each_role_is_said_ready_once_with_its_engine_time(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    watch = StartupWatch(tmp_path, started_at=time.time() - 10, every_s=3600)
    workers = ["trainer-0", "generator-0"]
    assert watch.poll(workers, first_step_seen=False) == []  # no logs yet
    _log(logs / "trainer-0.jsonl", event="trainer_ready", worker_id="trainer-0")
    _log(logs / "trainer-0.jsonl", event="started", worker_id="trainer-0", pid=1)
    _log(logs / "generator-0.jsonl", event="offered_previous_groups", worker_id="generator-0")
    [line] = watch.poll(workers, first_step_seen=False)
    assert line.startswith("trainer-0 ready, 1") and "after the command" in line and "vLLM" not in line
    with open(logs / "generator-0.jsonl", "a") as f:  # the engine's record, then `started` half written
        f.write(json.dumps({"event": "engine_started", "worker_id": "generator-0", "seconds": 88.66}) + "\n")
        f.write('{"event": "started", "worker_')
    assert watch.poll(workers, first_step_seen=False) == []  # a partial line waits for the next poll
    with open(logs / "generator-0.jsonl", "a") as f:
        f.write('id": "generator-0", "pid": 2}\n')
    [line] = watch.poll(workers, first_step_seen=False)
    assert line.startswith("generator-0 ready") and line.endswith("(vLLM engine start 88.7s)")
    _log(logs / "generator-0.jsonl", event="started", worker_id="generator-0", pid=3)  # a restart
    assert watch.poll(workers, first_step_seen=False) == []  # said once


def test_it_says_who_is_still_starting_and_stops_at_the_first_step(tmp_path):
    (tmp_path / "logs").mkdir()
    watch = StartupWatch(tmp_path, started_at=time.time() - 61, every_s=0)
    _log(tmp_path / "logs" / "trainer-0.jsonl", event="started", worker_id="trainer-0")
    lines = watch.poll(["trainer-0", "generator-0"], first_step_seen=False)
    assert lines[0].startswith("trainer-0 ready")
    assert lines[1] == "still starting, 61s after the command: waiting for generator-0"
    assert watch.poll(["trainer-0", "generator-0"], first_step_seen=True) == []
    _log(tmp_path / "logs" / "generator-0.jsonl", event="started", worker_id="generator-0")
    assert watch.poll(["trainer-0", "generator-0"], first_step_seen=False) == []  # done for good


def test_a_resumed_run_is_not_said_ready_from_the_earlier_runs_lines(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    _log(logs / "trainer-0.jsonl", event="started", worker_id="trainer-0")  # the run before the resume
    _log(logs / "generator-0.jsonl", event="engine_started", worker_id="generator-0", seconds=10.6)
    _log(logs / "generator-0.jsonl", event="started", worker_id="generator-0")
    watch = StartupWatch(tmp_path, started_at=time.time(), every_s=3600)
    assert watch.poll(["trainer-0", "generator-0"], first_step_seen=False) == []
    _log(logs / "generator-0.jsonl", event="engine_started", worker_id="generator-0", seconds=20.5)
    _log(logs / "generator-0.jsonl", event="started", worker_id="generator-0")
    _log(logs / "reward-0.jsonl", event="started", worker_id="reward-0")  # a log new since the resume
    lines = watch.poll(["trainer-0", "generator-0", "reward-0"], first_step_seen=False)
    assert [line.split(",")[0] for line in lines] == ["generator-0 ready", "reward-0 ready"]
    assert lines[0].endswith("(vLLM engine start 20.5s)")
