"""bench/jobs.py, the job harness of the e2e tests and the job benchmarks: the `streamrl up` command
line it builds, and its readers of a run directory (no job is started here)."""

from __future__ import annotations

import json
import sys

import pytest

from bench.jobs import CONFIGS, assert_exact, metrics, steps, up_args


def test_up_args_name_configs_make_paths_absolute_and_set_each_value(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text("{}\n")
    assert up_args("run", "trainer.steps=3", "run.export=false") == [
        sys.executable,
        "-m",
        "streamrl.cli",
        "up",
        "--run-dir",
        str(tmp_path / "run"),
        "--set",
        "trainer.steps=3",
        "--set",
        "run.export=false",
    ]
    assert up_args("run", config="tiny-judge-cpu.yaml")[4:6] == ["--config", str(CONFIGS / "tiny-judge-cpu.yaml")]
    assert up_args("run", config="mine.yaml")[4:6] == ["--config", str(tmp_path / "mine.yaml")]
    assert up_args("run", "trainer.lr=0.1", resume=True)[3:] == ["up", "--resume", str(tmp_path / "run")] + [
        "--set",
        "trainer.lr=0.1",
    ]


def test_metrics_reads_the_rows_written_so_far(tmp_path):
    assert metrics(tmp_path) == [] and steps(tmp_path) == []
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n" + json.dumps({"step": 2}) + "\n\n")
    assert steps(tmp_path) == [1, 2]


def test_assert_exact_names_a_lost_group():
    s = {"admitted": 3, "trained": 2, "dropped_stale": 0, "filtered": 0, "failed": 0, "requeued": 0}
    s |= {"in_flight": 0, "lost": 1, "double_trained": 0, "invariant_holds": False}
    with pytest.raises(AssertionError, match="'lost': 1"):
        assert_exact(s)
    assert_exact({**s, "trained": 3, "lost": 0, "invariant_holds": True}, in_flight_ok=False)
