"""Metric sinks the trainer's per-step records fan out to: W&B, TensorBoard, a Prometheus endpoint.

    metrics:
      sinks: [wandb, tensorboard, prometheus]    # configs/*.yaml; none by default
      prometheus_port: 9400

`make_sink(cfg, run_dir)` returns one object with `log(record)` and `close()`: a null sink when
none is configured, so callers never branch on what is switched on. Each record is flattened to
scalars (`staleness_hist: {"0": 12}` -> `staleness_hist/0`). A sink that fails (no network for
W&B online, a port in use) logs a warning and switches itself off: metrics never stop training.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger("streamrl").bind(component="sinks")


def scalars(record: dict, prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a record (nested dicts joined with '/'), finite values only; pure."""
    out: dict[str, float] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(scalars(value, name + "/"))
        elif isinstance(value, (int, float)) and math.isfinite(float(value)):
            out[name] = float(value)
    return out


class NullSink:
    def log(self, record: dict) -> None:
        pass

    def log_samples(self, step: int, rows: list[dict]) -> None:
        pass

    def close(self) -> None:
        pass


class WandbSink:
    """Weights & Biases; `offline` (default) writes RUN_DIR/wandb for a later `wandb sync`."""

    def __init__(self, cfg, run_dir: Path | None):
        import wandb

        m = cfg.metrics
        self.run = wandb.init(
            project=m.wandb_project,
            name=cfg.run.name,
            mode=m.wandb_mode,
            dir=str(run_dir) if run_dir else None,
            config=cfg.model_dump(mode="json"),
            reinit="finish_previous",
        )

    def log(self, record: dict) -> None:
        self.run.log(scalars(record), step=int(record.get("step", 0)))

    def log_samples(self, step: int, rows: list[dict]) -> None:
        """A `samples` table per step (W&B keeps each; its UI shows them by step)."""
        import wandb

        cols = ["step", "group_id", "sample", "prompt", "completion", "reward", "version", "staleness"]
        self.run.log({"samples": wandb.Table(columns=cols, data=[[r[c] for c in cols] for r in rows])}, step=step)

    def close(self) -> None:
        self.run.finish()


class TensorBoardSink:
    """TensorBoard event files in metrics.tensorboard_dir (default RUN_DIR/tensorboard)."""

    def __init__(self, cfg, run_dir: Path | None):
        from torch.utils.tensorboard import SummaryWriter

        where = cfg.metrics.tensorboard_dir or (Path(run_dir) / "tensorboard" if run_dir else "runs/tensorboard")
        self.writer = SummaryWriter(log_dir=str(where))

    def log(self, record: dict) -> None:
        step = int(record.get("step", 0))
        for name, value in scalars(record).items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def log_samples(self, step: int, rows: list[dict]) -> None:
        """The step's samples as one markdown text entry (TensorBoard's Text tab)."""
        from streamrl.train.samples import format_sample

        body = "\n\n".join("    " + format_sample(r).replace("\n", "\n    ") for r in rows)
        self.writer.add_text("samples", body, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class PrometheusSink:
    """Gauges `streamrl_<metric>{run=...}` served at http://HOST:metrics.prometheus_port/metrics."""

    def __init__(self, cfg, run_dir: Path | None):
        import prometheus_client as pc

        self.pc = pc
        self.registry = pc.CollectorRegistry()
        self.gauges: dict[str, Any] = {}
        self.run = cfg.run.name
        self.server, self.thread = pc.start_http_server(
            cfg.metrics.prometheus_port, addr=cfg.metrics.prometheus_addr, registry=self.registry
        )

    def log(self, record: dict) -> None:
        for name, value in scalars(record).items():
            metric = "streamrl_" + re.sub(r"[^a-zA-Z0-9_]", "_", name)
            if metric not in self.gauges:
                self.gauges[metric] = self.pc.Gauge(
                    metric, f"streamrl trainer metric {name}", ["run"], registry=self.registry
                )
            self.gauges[metric].labels(run=self.run).set(value)

    def log_samples(self, step: int, rows: list[dict]) -> None:
        pass  # text is no gauge

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


SINKS = {"wandb": WandbSink, "tensorboard": TensorBoardSink, "prometheus": PrometheusSink}


class FanOut:
    """Logs to every sink; one that raises is reported once and dropped."""

    def __init__(self, sinks: dict[str, Any]):
        self.sinks = sinks

    def _each(self, method: str, *args) -> None:
        for name, sink in list(self.sinks.items()):
            try:
                getattr(sink, method)(*args)
            except Exception as exc:  # a metrics backend must never take the trainer down
                log.warning("metric_sink_failed", sink=name, during=method, error=repr(exc))
                self.sinks.pop(name, None)

    def log(self, record: dict) -> None:
        self._each("log", record)

    def log_samples(self, step: int, rows: list[dict]) -> None:
        self._each("log_samples", step, rows)

    def close(self) -> None:
        self._each("close")
        self.sinks = {}


def make_sink(cfg, run_dir: Path | None):
    """The sinks cfg.metrics.sinks names, behind one log/close; NullSink when there are none."""
    names = list(getattr(getattr(cfg, "metrics", None), "sinks", []) or [])
    if not names:
        return NullSink()
    started = {}
    for name in names:
        try:
            started[name] = SINKS[name](cfg, run_dir)
        except Exception as exc:  # e.g. the Prometheus port is taken: say so, train anyway
            log.warning(
                "metric_sink_unavailable",
                sink=name,
                error=repr(exc),
                fix="see metrics.* in the config (port, wandb_mode) or remove the sink from metrics.sinks",
            )
    return FanOut(started)
