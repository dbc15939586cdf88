"""`streamrl account`: the accounting invariant of a run whose roles were started by hand
(`streamrl worker ROLE` on several hosts, docs/multihost.md), as `streamrl up` checks it at its end.

    streamrl account --config C.yaml --run RUN --run-dir DIR --broker redis://:PW@broker:6379/0

Run it after the trainer has exited and the other workers have been stopped (SIGTERM: they hand
back what they hold). Writes DIR/summary.json (streamrl/core/accounting.py) and prints one line;
exits 0 when the invariant holds (lost 0, double-trained 0), 3 when it does not.
"""

from __future__ import annotations

from pathlib import Path

from streamrl.commands.common import add_broker_arg, broker_url
from streamrl.config.args import add_config_args, load

NAME = "account"
HELP = "check the accounting of a run whose workers were started by hand (multi-host)"
DESCRIPTION = (
    "Check the accounting invariant (admitted = trained + dropped + failed + ... + lost, lost 0) of a run "
    "on its broker and write RUN_DIR/summary.json, as `streamrl up` does when it ends."
)


def add_arguments(p) -> None:
    add_config_args(p)
    add_broker_arg(p)
    p.add_argument("--run", help="run name (overrides run.name)")
    p.add_argument("--run-dir", required=True, help="where summary.json goes (the trainer's --run-dir)")


def run(args) -> int:
    from streamrl.core.accounting import write_summary

    cfg = load(args)
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    per_group = cfg.rollout.group_size if cfg.env.fn else 0
    s = write_summary(broker_url(args, cfg), cfg.run.name, run_dir, per_group)
    parts = ("trained", "dropped_stale", "filtered", "failed", "requeued", "in_flight", "lost")
    print(
        f"run {cfg.run.name}: {s['trained_steps']} steps trained; groups admitted {s['admitted']} = "
        + " + ".join(f"{k} {s.get(k, 0)}" for k in parts)
        + f"; double-trained {s['double_trained']}; invariant {'holds' if s['invariant_holds'] else 'VIOLATED'} "
        f"({run_dir / 'summary.json'})"
    )
    return 0 if s["invariant_holds"] else 3
