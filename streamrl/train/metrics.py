"""Per-step metrics: one JSON object per trainer step in RUN_DIR/metrics.jsonl (and the broker's
`metrics` stream, for live views). A null writer stands in when there is no run directory.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from streamrl.train.samples import FILE, sample_rows


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return value.item()
    return value


class MetricsWriter:
    def __init__(self, run_dir: Path | None, cfg=None):
        """`cfg` (a Config) switches on the sinks of cfg.metrics (streamrl/train/sinks.py: W&B, TensorBoard, Prometheus)."""
        from streamrl.train.sinks import NullSink, make_sink

        self.path = Path(run_dir) / "metrics.jsonl" if run_dir else None
        self._fh = open(self.path, "a", buffering=1) if self.path else None
        self.sink = make_sink(cfg, run_dir) if cfg is not None else NullSink()
        self.samples_per_step = cfg.metrics.samples_per_step if cfg is not None else 0
        self._samples = open(Path(run_dir) / FILE, "a", buffering=1) if run_dir and self.samples_per_step else None

    def write(self, record: dict) -> str:
        clean = {k: _clean(v) for k, v in record.items()}
        line = json.dumps(clean, sort_keys=False)
        if self._fh:
            self._fh.write(line + "\n")
        self.sink.log(clean)
        return line

    def write_samples(self, batch, step: int) -> list[dict]:
        """metrics.samples_per_step rollouts of this step's batch to samples.jsonl and the sinks."""
        rows = sample_rows(batch, step, self.samples_per_step)
        if self._samples and rows:
            self._samples.write("".join(json.dumps(r) + "\n" for r in rows))
        if rows:
            self.sink.log_samples(step, rows)
        return rows

    def close(self) -> None:
        if self._fh:
            self._fh.close()
            self._fh = None
        if self._samples:
            self._samples.close()
            self._samples = None
        self.sink.close()


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
