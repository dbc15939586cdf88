"""What evaluating a checkpoint alone leaves (`streamrl eval`, streamrl/launch/evaluate.py): the
metrics of an eval round (streamrl/eval/rounds.py, round_record) and every completion, in
RUN_DIR/eval/step-N/:

    metrics.json      the eval/* metrics (the names metrics.jsonl's eval rounds use), the settings, the time
    samples.jsonl     one row per completion, in RUN_DIR/samples.jsonl's format (`streamrl samples
                      RUN_DIR/eval/step-N` prints them)

    result = EvalResult(run_dir, step, metrics, out_dir, seconds, model)
    print(result.headline())          # "pass@1 0.962 | pass@8 1.000 | mean@8 0.962 | maj@8 1.000"
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

METRICS_FILE = "metrics.json"
SAMPLES_FILE = "samples.jsonl"
"""The same name as a run's own samples file, so `streamrl samples` reads an eval folder as it reads a run."""


def eval_dir(run_dir: Path, step: int) -> Path:
    """Where the evaluation of checkpoint `step` of a run goes: RUN_DIR/eval/step-N."""
    return Path(run_dir) / "eval" / f"step-{step}"


@dataclass
class EvalResult:
    """One checkpoint's evaluation: `evaluate()`'s return value (streamrl/launch/evaluate.py)."""

    run_dir: Path
    step: int
    """The trainer step whose weights were evaluated (0: the base model, model.path)."""
    metrics: dict
    """eval/pass@k, eval/mean@n, eval/maj@n, eval/correct_frac, eval/prompts, eval/reward_errors,
    eval/completion_len_mean, ...: what an eval round at this step writes to metrics.jsonl."""
    out_dir: Path
    """The folder holding metrics.json and samples.jsonl."""
    seconds: float
    """Wall time of the evaluation (weights, engine start, generation, scoring)."""
    model: str
    """What was loaded: the checkpoint folder, or the base model's for step 0."""

    @property
    def samples_path(self) -> Path:
        return self.out_dir / SAMPLES_FILE

    @property
    def metrics_path(self) -> Path:
        return self.out_dir / METRICS_FILE

    def headline(self) -> str:
        """pass@k, mean@n and maj@n on one line, as the console's step lines show an eval round's."""
        keys = [k for k in self.metrics if k.startswith(("eval/pass@", "eval/mean@", "eval/maj@"))]
        return " | ".join(f"{k.removeprefix('eval/')} {self.metrics[k]:.3f}" for k in keys)


def write_result(result: EvalResult, rows: list[dict], settings: dict) -> None:
    """metrics.json and samples.jsonl into result.out_dir, each written whole then renamed (an
    evaluation of the same step again replaces both; a reader never sees half of one)."""
    out = result.out_dir
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "step": result.step,
        "model": result.model,
        "seconds": round(result.seconds, 2),
        "settings": settings,
        **result.metrics,
    }
    _replace(out / METRICS_FILE, json.dumps(record, indent=1) + "\n")
    _replace(out / SAMPLES_FILE, "".join(json.dumps(r) + "\n" for r in rows))


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
