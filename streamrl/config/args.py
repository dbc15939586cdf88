"""The command-line arguments that `streamrl` commands and the benches (bench/) share: the config
(`--config`, repeatable `--set SECTION.FIELD=VALUE`) and an output folder (`--out DIR`).

    add_config_args(parser)
    cfg = load(parser.parse_args())        # Config, with --set and --run applied
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from streamrl.config.files import load_config
from streamrl.config.schema import Config
from streamrl.core.errors import ConfigError


def add_config_args(p: argparse.ArgumentParser) -> None:
    """`--config FILE` and repeatable `--set SECTION.FIELD=VALUE` (read by `load`)."""
    p.add_argument("--config", help="YAML config (default: configs/tiny-cpu.yaml)")
    add_set_arg(p)


def add_set_arg(p: argparse.ArgumentParser, example: str = "trainer.steps=20", what: str = "one config value") -> None:
    """Repeatable `--set SECTION.FIELD=VALUE` into args.overrides (alone: commands that read a run's own config)."""
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help=f"override {what}, e.g. --set {example} (repeatable)",
    )


def load(args) -> Config:
    """The config the arguments name: `--config` (or the default) with each `--set`, and `--run` as run.name."""
    overrides = list(args.overrides)
    if getattr(args, "run", None):
        overrides.append(f"run.name={args.run}")
    return load_config(args.config, overrides)


def prepare_out_dir(out: str | None) -> Path | None:
    """Create an `--out DIR` and check that it is writable now, not when a long run ends; None without one."""
    if not out:
        return None
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".streamrl-write-check-"):
            pass
    except OSError as exc:
        raise ConfigError(
            f"--out {out}: cannot write there ({exc.strerror or exc}); pass a directory you can write to"
        ) from None
    return path
