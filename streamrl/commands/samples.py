"""`streamrl samples RUN_DIR [--step N]`: what the model generated, from RUN_DIR/samples.jsonl.

    streamrl samples runs/tiny-20260101-120000            # every kept sample, step by step
    streamrl samples runs/tiny-20260101-120000 --step 5   # one step's
    streamrl samples runs/tiny-20260101-120000 --last 2   # the last two steps'

The trainer keeps metrics.samples_per_step rollouts of each step (streamrl/train/samples.py).
"""

from __future__ import annotations

import json
from pathlib import Path

NAME = "samples"
HELP = "print the rollouts a run kept of each step (prompt, completion, reward, staleness)"


def add_arguments(p) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (holds samples.jsonl)")
    p.add_argument("--step", type=int, help="only this step's samples")
    p.add_argument("--last", type=int, help="only the last N steps' samples")
    p.add_argument("--json", action="store_true", help="print the rows as JSON lines")


def run(args) -> int:
    from streamrl.core.errors import ConfigError
    from streamrl.train.samples import FILE, format_sample, read_samples

    run_dir = Path(args.run_dir)
    if not (run_dir / FILE).is_file():
        raise ConfigError(
            f"{run_dir} has no {FILE}; pass the directory of a `streamrl up` run that trained a step "
            "with metrics.samples_per_step > 0"
        )
    rows = read_samples(run_dir, args.step)
    if args.last:
        keep = sorted({r["step"] for r in rows})[-args.last :]
        rows = [r for r in rows if r["step"] in keep]
    if not rows:
        have = sorted({r["step"] for r in read_samples(run_dir)})
        span = f"{have[0]}..{have[-1]}" if have else "none"
        raise ConfigError(f"{run_dir / FILE} has no samples of step {args.step}; it has steps {span}")
    for row in rows:
        print(json.dumps(row) if args.json else format_sample(row) + "\n", flush=True)
    return 0
