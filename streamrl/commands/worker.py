"""`streamrl worker ROLE`: one role process against a broker (multi-host, elastic scale-out)."""

from __future__ import annotations

import os
from pathlib import Path

from streamrl.commands.common import add_broker_arg, broker_url
from streamrl.config.args import add_config_args, load
from streamrl.core.errors import EXIT_NO_RESTART, ConfigError

NAME = "worker"
HELP = "run one role process against a broker (multi-host, elastic)"
DESCRIPTION = (
    "Run one role. Joins a running job: the same command on any host that reaches the broker "
    "adds a worker of that role."
)
ROLES = ["feeder", "generator", "reward", "reference", "judge", "env", "trainer"]


def add_arguments(p) -> None:
    p.add_argument("role", choices=ROLES)
    add_config_args(p)
    add_broker_arg(p)
    p.add_argument("--run", help="run name (overrides run.name)")
    p.add_argument("--run-dir", help="folder for this worker's logs (and the trainer's metrics)")
    p.add_argument("--id", help="worker id, unique within its role (default: ROLE-HOST-PID)")


def run(args) -> int:
    from streamrl.launch.runtime import print_fatal, run_role

    try:
        cfg = load(args)
        url = broker_url(args, cfg)
        if cfg.model.path is None:
            from streamrl.models.tiny import resolve_model

            cfg = resolve_model(cfg)
    except ConfigError as exc:  # the same config on every restart: tell the supervisor not to retry
        print_fatal(f"config error: {exc}")
        return EXIT_NO_RESTART
    wid = args.id or f"{args.role}-{os.uname().nodename}-{os.getpid()}"
    return run_role(args.role, cfg, url, wid, Path(args.run_dir) if args.run_dir else None)
