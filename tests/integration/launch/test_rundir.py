"""Run-directory state (streamrl/launch/rundir.py) on a real filesystem: fresh default dirs, the `up` lock,
what counts as an earlier run, and when a summary means the run has finished.

    pytest tests/integration/launch/test_rundir.py
"""

import json

import pytest

from streamrl.core.errors import ConfigError
from streamrl.launch.rundir import claim, describe_finished, earlier_run, finished_summary, is_live, new_run_dir


def test_default_run_dirs_started_in_one_second_are_distinct(tmp_path):
    dirs = [new_run_dir(tmp_path / "runs", "tiny") for _ in range(3)]
    assert len(set(dirs)) == 3 and all(d.is_dir() and d.name.startswith("tiny-") for d in dirs)


def test_the_up_lock_marks_a_live_run_and_refuses_a_second_up(tmp_path):
    assert not is_live(tmp_path)
    lock = claim(tmp_path)
    assert is_live(tmp_path)
    with pytest.raises(ConfigError, match=r"another `streamrl up` \(pid \d+\) is running"):
        claim(tmp_path)
    (tmp_path / "summary.json").write_text(json.dumps({"admitted": 8, "trained": 8}))
    assert finished_summary(tmp_path) is None  # an `up --resume` still running: not finished
    lock.close()  # what the kernel does when `up` exits, however it exits
    assert not is_live(tmp_path)
    assert finished_summary(tmp_path) == {"admitted": 8, "trained": 8}


def test_earlier_run_and_the_finished_message(tmp_path):
    assert earlier_run(tmp_path) is None
    claim(tmp_path).close()
    assert earlier_run(tmp_path) is None  # the lock file alone is not a run
    (tmp_path / "config.yaml").write_text("run: {name: tiny}\n")
    (tmp_path / "checkpoints").mkdir()
    assert earlier_run(tmp_path) == "checkpoints"
    s = {
        "admitted": 24,
        "trained": 24,
        "dropped_stale": 0,
        "filtered": 0,
        "failed": 0,
        "requeued": 0,
        "in_flight": 0,
        "lost": 0,
        "double_trained": 0,
        "invariant_holds": True,
        "trained_steps": 3,
        "checkpointed_version": 3,
    }
    text = describe_finished(tmp_path, s)
    for piece in (
        "has finished",
        "3 steps trained",
        "groups admitted 24 = trained 24 + dropped_stale 0",
        "invariant holds",
        f"streamrl up --resume {tmp_path}",
        str(tmp_path / "summary.json"),
    ):
        assert piece in text, text
    (tmp_path / "summary.json").write_text("{torn")
    assert finished_summary(tmp_path) is None
