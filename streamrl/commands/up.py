"""`streamrl up`: the whole job on this machine (broker + every role), progress on the console.
The job itself is streamrl/launch/job.py's (the Python API's streamrl.run runs the same)."""

from __future__ import annotations

import functools
from pathlib import Path

from streamrl.commands.common import add_preflight_arg
from streamrl.config.args import add_config_args, load
from streamrl.core.errors import ConfigError
from streamrl.launch.job import already_trained, command_started_at, prepare_job

NAME = "up"
HELP = "run a whole job on this machine (broker + every role)"
DESCRIPTION = (
    "Start the broker (if broker.url is 'embedded') and every role with its configured count, "
    "print progress, and stop everything when training ends."
)


def add_arguments(p) -> None:
    add_config_args(p)
    add_preflight_arg(p)
    p.add_argument("--run-dir", help="output folder (default: a new folder under runs/)")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="the full step line (samples, tokens, trainer wait/train time, MFU, generator rate and busy share) "
        "on the console; RUN_DIR/logs/steps.log has it either way",
    )
    p.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR: its config (plus --set), "
        "its broker (embedded: the same data dir and append-only file), its newest checkpoint",
    )


def run(args) -> int:
    if args.resume:
        if not (Path(args.resume) / "config.yaml").is_file():
            raise ConfigError(
                f"--resume {args.resume}: no config.yaml there; pass the run directory of an earlier `streamrl up`"
            )
        written = Path(args.resume) / "config.yaml"
        args.config, args.run_dir = args.config or str(written), args.resume
    cfg = load(args)
    if args.resume and Path(args.config) == written:
        from streamrl.losses.resume import switch_objective

        cfg, note = switch_objective(written, cfg, args.overrides)
        if note:
            print(note, flush=True)
    if args.resume and (done := already_trained(Path(args.resume), cfg.trainer.steps)):
        print(done, flush=True)  # before the broker and the roles: ~76 s of start-up that would train nothing
        return 0
    say = functools.partial(print, flush=True)
    job = prepare_job(
        cfg,
        args.run_dir,
        resume=bool(args.resume),
        check=args.preflight,
        say=say,
        started_at=command_started_at(),
        verbose=args.verbose,
    )
    return job.run()
