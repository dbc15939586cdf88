"""Per-step metrics: one JSON object per trainer step in RUN_DIR/metrics.jsonl (and the broker's
`metrics` stream, for live views). A null writer stands in when there is no run directory.

    row = step_row(batch, version, time_s=..., train_s=...)   # what the batch and the step's timing say
    MetricsWriter(run_dir, cfg).write(row)

`step_row` is the row's common part: workers/trainer.py adds what only a real trainer knows (episode
counters, the engine's loss metrics, FLOPs, checkpoint stalls, eval); bench/sim_workers.py's stand-in
trainer writes it as it is.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from streamrl.core.batch import Batch, zero_variance_frac
from streamrl.core.staleness import staleness_histogram
from streamrl.train.samples import FILE, sample_rows


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return value.item()
    return value


def step_row(
    batch: Batch,
    version: int,
    time_s: float,
    train_s: float,
    stall_s: float | None = None,
    overlap: int | None = None,
) -> dict:
    """The metrics.jsonl row of the step that trained `batch` into `version`: rewards, tokens, staleness,
    the wait for the batch and the assembler's counters (batch.stats), `time_s` since the trainer
    started and `train_s` of training. `stall_s` (the weight snapshot's stall) and `overlap` (rollouts
    that finished while the trainer trained) where the trainer measures them; None leaves them out."""
    tokens = [len(r.completion_ids) for r in batch.rollouts]
    row = {
        "step": version,
        "policy_version": version,
        "reward_mean": float(np.mean(batch.rewards)),
        "reward_std": float(np.std(batch.rewards)),
        "samples": len(batch),
        "tokens": int(sum(tokens)),
        "staleness_max": int(batch.staleness.max()),
        "staleness_mean": float(batch.staleness.mean()),
        "staleness_hist": staleness_histogram(batch.staleness),
        "staleness_hist_tokens": staleness_histogram(batch.staleness, tokens),
        "time_s": round(time_s, 3),
        "wait_s": round(batch.stats.get("wait_s", 0.0), 4),
        "train_s": round(train_s, 4),
    }
    if stall_s is not None:
        row["publish_stall_s"] = round(stall_s, 4)
    if overlap is not None:
        row["overlap_rollouts"] = overlap
        row["overlap_frac"] = overlap / max(1, len(batch))
    return {
        **row,
        "completion_len_mean": float(np.mean(tokens)),
        "zero_variance_frac": zero_variance_frac(batch.rewards, batch.group_index),
        "reward_components": {k: float(np.mean(v)) for k, v in batch.reward_components.items()},
        **{k: v for k, v in batch.stats.items() if k != "wait_s"},
    }


class MetricsWriter:
    def __init__(self, run_dir: Path | None, cfg=None):
        """`cfg` (a Config) switches on the sinks of cfg.metrics (streamrl/train/sinks.py: W&B, TensorBoard, Prometheus)."""
        from streamrl.train.sinks import NullSink, make_sink

        self.path = Path(run_dir) / "metrics.jsonl" if run_dir else None
        self._fh = open(self.path, "a", buffering=1) if self.path else None
        self.sink = make_sink(cfg, run_dir) if cfg is not None else NullSink()
        self.samples_per_step = cfg.metrics.samples_per_step if cfg is not None else 0
        self.reward_weights = cfg.reward_weights() if cfg is not None else {}
        """What each sample row says its reward was summed from (`streamrl samples` prints the sum)."""
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
        rows = sample_rows(batch, step, self.samples_per_step, self.reward_weights)
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
