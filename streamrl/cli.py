"""The `streamrl` command line. Each subcommand lives in streamrl/commands/<name>.py.

streamrl up                                   # the tiny CPU job on an embedded broker
streamrl up --config configs/X.yaml --set trainer.steps=20 --run-dir runs/demo
streamrl worker generator --broker redis://:pw@host:6379/0 --run tiny --config X.yaml
streamrl config --config X.yaml --set loss.name=gspo      # validate and print the resolved config
"""

from __future__ import annotations

import argparse
import os
import sys

from streamrl.commands import load_modules
from streamrl.core.errors import ConfigError, StreamRLError

COMMANDS = [
    "up",
    "sft",
    "export",
    "eval",
    "worker",
    "config",
    "plan",
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


def _modules(names: list[str]) -> dict:
    return load_modules("streamrl.commands", names)


def build_parser(names: list[str] | None = None) -> tuple[argparse.ArgumentParser, dict]:
    """The parser of the commands `names` (default: all of them, for `streamrl --help`)."""
    parser = argparse.ArgumentParser(
        prog="streamrl",
        description="Asynchronous streaming RL post-training "
        "of LLMs: every role is a process connected through Redis Streams.",
        epilog=EPILOG,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    modules = _modules(COMMANDS if names is None else names)
    for name, mod in modules.items():
        p = sub.add_parser(name, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP))
        mod.add_arguments(p)
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Only the named command's module: every role process starts as `streamrl worker ...`, and the
    # other commands' imports cost each of them a few tenths of a second of start-up (more on a
    # loaded machine). Anything else (--help, a typo) gets every command, for the listing.
    parser, modules = build_parser(argv[:1] if argv[:1] and argv[0] in COMMANDS else None)
    args = parser.parse_args(argv)
    try:
        return modules[args.command].run(args)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    except StreamRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


FAST_EXIT = ("up", "worker", "eval")
"""Commands whose process ends with os._exit once the command has returned: the interpreter's
teardown of torch, transformers and vLLM modules costs 1-2 s on an idle 2-core machine and 5-6 s
on a loaded one (docs/benchmarks/test-suite-time_cpu_2026-12-02.md), on every job's path: `up`
waits for every role's exit before its accounting, and users and tests wait for up's. Their
work (acks, checkpoints, logs) is done and flushed by then; an exception still exits normally."""


def entry() -> None:
    """The `streamrl` program (console script and `python -m streamrl.cli`); main() for in-process use."""
    code = main()
    if sys.argv[1:2] and sys.argv[1] in FAST_EXIT:
        import logging

        logging.shutdown()  # flushes the file handlers (RUN_DIR/logs/*.jsonl)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
