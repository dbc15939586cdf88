"""The `streamrl` command line. Each subcommand lives in streamrl/commands/<name>.py.

streamrl up                                   # the tiny CPU job on an embedded broker
streamrl up --config configs/X.yaml --set trainer.steps=20 --run-dir runs/demo
streamrl worker generator --broker redis://:pw@host:6379/0 --run tiny --config X.yaml
streamrl config --config X.yaml --set loss.name=gspo      # validate and print the resolved config
"""

from __future__ import annotations

import argparse
import sys

from streamrl.commands import load_modules
from streamrl.core.errors import ConfigError, StreamRLError

COMMANDS = [
    "up",
    "sft",
    "export",
    "worker",
    "config",
    "scale",
    "status",
    "account",
    "producer",
    "envuser",
    "reward",
    "env",
    "bench",
    "report",
    "samples",
]
"""Subcommand modules under streamrl.commands, in --help order (a module not present is skipped)."""

EPILOG = """Every role can also run alone: `streamrl worker ROLE` joins a running job through its broker
URL (from --broker, $STREAMRL_BROKER_URL, or RUN_DIR/broker/url). See README.md."""


def _modules() -> dict:
    return load_modules("streamrl.commands", COMMANDS)


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = argparse.ArgumentParser(
        prog="streamrl",
        description="Asynchronous streaming RL post-training "
        "of LLMs: every role is a process connected through Redis Streams.",
        epilog=EPILOG,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    modules = _modules()
    for name, mod in modules.items():
        p = sub.add_parser(name, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP))
        mod.add_arguments(p)
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    parser, modules = build_parser()
    args = parser.parse_args(argv)
    try:
        return modules[args.command].run(args)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    except StreamRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
