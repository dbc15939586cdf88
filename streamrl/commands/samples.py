"""`streamrl samples RUN_DIR [--step N]`: what the model generated, from RUN_DIR/samples.jsonl.

    streamrl samples runs/tiny-20260101-120000            # every kept sample, step by step
    streamrl samples runs/tiny-20260101-120000 --step 5   # one step's
    streamrl samples runs/tiny-20260101-120000 --last 2   # the last two steps'

The trainer keeps metrics.samples_per_step rollouts of each step (streamrl/train/samples.py).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
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
    untagged = tools_job(run_dir)
    try:
        for row in rows:
            if untagged is not False and not args.json:
                row = {**row, "tool_calls": tools_called(row, untagged)} if row.get("turns") else row
            print(json.dumps(row) if args.json else format_sample(row) + "\n", flush=True)
    except BrokenPipeError:
        # The reader stopped reading (`streamrl samples RUN | head`): that is the end, not an error.
        # stdout goes to /dev/null so the interpreter's final flush does not raise it again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def tools_job(run_dir: Path) -> str | None | bool:
    """False when the run's config names no tools (its episodes call none); else tools.untagged (None
    or the tool a turn without call markup calls)."""
    from streamrl.commands.common import run_dir_config

    try:
        cfg = run_dir_config(run_dir)
    except Exception:  # an unreadable config only costs the tools part of the header
        return False
    return cfg.tools.untagged if cfg is not None and cfg.tools.names else False


def tools_called(row: dict, untagged: str | None) -> list[str]:
    """The tools an episode's model turns called, each with its count (`python x2`), in first-call order:
    the calls parsed from each model turn (streamrl/envs/tool_calls.py), or `untagged` for a turn
    without call markup that the env answered."""
    from streamrl.envs.tool_calls import parse_tool_calls

    names: list[str] = []
    turns = row["turns"]
    for i, turn in enumerate(turns):
        if turn["role"] != "model":
            continue
        calls = [c.name or "a malformed call" for c in parse_tool_calls(turn["text"])]
        if not calls and untagged and i + 1 < len(turns):
            calls = [untagged]
        names += calls
    counts = Counter(names)
    return [f"{n} x{c}" if c > 1 else n for n, c in counts.items()]
