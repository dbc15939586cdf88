"""`streamrl report RUN_DIR`: a run's summary table and PNG plots, from RUN_DIR/metrics.jsonl and logs.

    streamrl report runs/tiny-20260101-120000                 # plots into RUN_DIR/report/
    streamrl report runs/demo --out /tmp/plots --json         # also print the summary as JSON

The summary is streamrl/report/summary.py's, the plots streamrl/report/figures.py's (which says what
each shows). samples.html shows the rollouts the trainer kept of each step (RUN_DIR/samples.jsonl,
metrics.samples_per_step).
"""

from __future__ import annotations

import json
from pathlib import Path

NAME = "report"
HELP = "plots and a summary of a finished (or running) run from its metrics.jsonl"


def add_arguments(p) -> None:
    p.add_argument("run_dir", help="a run directory (holds metrics.jsonl)")
    p.add_argument("--out", help="where the PNGs go (default RUN_DIR/report)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON too")


def run(args) -> int:
    from streamrl.core.errors import ConfigError
    from streamrl.report.figures import plot_run
    from streamrl.report.samples_html import write_samples_html
    from streamrl.report.summary import summarize
    from streamrl.train.samples import FILE as SAMPLES_FILE
    from streamrl.train.samples import read_samples

    run_dir = Path(args.run_dir)
    if not (run_dir / "metrics.jsonl").is_file():
        raise ConfigError(
            f"{run_dir} has no metrics.jsonl; pass a run directory (runs/<name>-<time>) "
            "of a `streamrl up` that has trained at least one step"
        )
    summary = summarize(run_dir)
    out = Path(args.out) if args.out else run_dir / "report"
    written = plot_run(run_dir, out)
    if (run_dir / SAMPLES_FILE).is_file():
        written.append(write_samples_html(read_samples(run_dir), out / "samples.html", f"samples of {run_dir.name}"))
    for key, value in summary.items():
        print(f"{key:>26}  {value}")
    print(f"wrote {', '.join(p.name for p in written)} to {out}")
    if args.json:
        print(json.dumps(summary))
    return 0
