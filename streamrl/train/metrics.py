"""Per-step metrics: one JSON object per trainer step in RUN_DIR/metrics.jsonl (and the broker's
`metrics` stream, for live views). A null writer stands in when there is no run directory.
"""

from __future__ import annotations

import json
import math
from pathlib import Path


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

    def write(self, record: dict) -> str:
        clean = {k: _clean(v) for k, v in record.items()}
        line = json.dumps(clean, sort_keys=False)
        if self._fh:
            self._fh.write(line + "\n")
        self.sink.log(clean)
        return line

    def close(self) -> None:
        if self._fh:
            self._fh.close()
            self._fh = None
        self.sink.close()


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
