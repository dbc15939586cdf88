"""MetricsWriter fans out to the sinks cfg.metrics switches on: TensorBoard event files, a live
Prometheus /metrics endpoint, W&B in offline mode; a sink that cannot start is skipped with a warning.

    pytest tests/integration/train/test_metric_sinks.py
"""

from __future__ import annotations

import json
import socket
import urllib.request

import pytest
from structlog.testing import capture_logs

from streamrl.config.schema import Config, MetricsConfig, RunConfig
from streamrl.train.metrics import MetricsWriter
from streamrl.train.sinks import NullSink, scalars

pytestmark = pytest.mark.timeout(120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _record(step: int) -> dict:
    return {
        "step": step,
        "reward_mean": 0.25 * step,
        "loss": float("nan"),
        "staleness_hist": {"0": 6, "1": 2},
        "samples": 8,
        "note": "text is skipped",
    }


def test_scalars_flattens_nested_and_skips_non_numbers():
    assert scalars(_record(2)) == {
        "step": 2.0,
        "reward_mean": 0.5,
        "staleness_hist/0": 6.0,
        "staleness_hist/1": 2.0,
        "samples": 8.0,
    }


def test_no_sinks_is_a_null_sink(tmp_path):
    w = MetricsWriter(tmp_path, Config())
    assert isinstance(w.sink, NullSink)
    w.write(_record(1))
    w.close()
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["reward_mean"] == 0.25


def test_tensorboard_and_prometheus_receive_every_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    port = _free_port()
    cfg = Config(
        run=RunConfig(name="sinks"), metrics=MetricsConfig(sinks=["tensorboard", "prometheus"], prometheus_port=port)
    )
    w = MetricsWriter(tmp_path, cfg)
    for step in (1, 2, 3):
        w.write(_record(step))
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'streamrl_reward_mean{run="sinks"} 0.75' in body
    assert 'streamrl_staleness_hist_1{run="sinks"} 2.0' in body
    w.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("reward_mean")] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert "loss" not in acc.Tags()["scalars"]  # NaN is not plotted


def test_wandb_offline_writes_a_local_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = Config(run=RunConfig(name="sinks"), metrics=MetricsConfig(sinks=["wandb"], wandb_mode="offline"))
    w = MetricsWriter(tmp_path, cfg)
    w.write(_record(1))
    w.write(_record(2))
    w.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_a_sink_that_cannot_start_is_skipped(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = Config(metrics=MetricsConfig(sinks=["prometheus", "tensorboard"], prometheus_port=port))
        with capture_logs() as logs:
            w = MetricsWriter(tmp_path, cfg)
        w.write(_record(1))
        w.close()
    assert [e["sink"] for e in logs if e["event"] == "metric_sink_unavailable"] == ["prometheus"]
    assert list((tmp_path / "tensorboard").iterdir())


def test_wandb_takes_the_samples_as_a_table(tmp_path, monkeypatch):
    """FanOut drops a sink that raises (with a warning): no warning means the table was logged."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = Config(run=RunConfig(name="sinks"), metrics=MetricsConfig(sinks=["wandb"], wandb_mode="offline"))
    row = {
        "step": 1,
        "group_id": "g0",
        "sample": 0,
        "prompt": "2+2?",
        "completion": "4",
        "reward": 1.0,
        "version": 0,
        "staleness": 0,
    }
    with capture_logs() as logs:
        w = MetricsWriter(tmp_path, cfg)
        w.write(_record(1))
        w.sink.log_samples(1, [row])
        w.close()
    assert not [e for e in logs if e["event"] == "metric_sink_failed"], logs
