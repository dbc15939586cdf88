"""Helpers shared by subcommands: broker URL lookup, pre-flight, section flags, the flags of commands that
attach user code. The config arguments (--config, --set, --out) are streamrl/config/args.py's, the
model path streamrl/models/tiny.py's: the benches use them too."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from streamrl.config.files import load_config
from streamrl.config.schema import Config
from streamrl.core.errors import ConfigError


def run_dir_config(run_dir: str | Path) -> Config | None:
    """The config a `streamrl up` wrote to RUN_DIR/config.yaml (None without one)."""
    path = Path(run_dir) / "config.yaml"
    return load_config(path) if path.is_file() else None


def broker_url(args, cfg: Config | None = None) -> str:
    """--broker, then $STREAMRL_BROKER_URL, then the broker of the `streamrl up` in --run-dir (its embedded
    server's RUN_DIR/broker/url, else the external broker.url of its RUN_DIR/config.yaml), then `cfg`'s
    external broker.url; a config's URL comes with its password_env / password_file."""
    if getattr(args, "broker", None):
        return args.broker
    if os.environ.get("STREAMRL_BROKER_URL"):
        return os.environ["STREAMRL_BROKER_URL"]
    run_dir = getattr(args, "run_dir", None)
    if run_dir and (Path(run_dir) / "broker" / "url").exists():
        return (Path(run_dir) / "broker" / "url").read_text().strip()
    for config in (run_dir_config(run_dir) if run_dir else None, cfg):
        if config is not None and config.broker.url != "embedded":
            return config.broker.connect_url()
    raise ConfigError(
        "no broker URL: pass --broker redis://HOST:6379/0 (or redis+cluster://HOST:PORT,...), set "
        "STREAMRL_BROKER_URL, or --run-dir of a running `streamrl up`"
    )


def add_broker_arg(p: argparse.ArgumentParser, whose: str = "the") -> None:
    """--broker: any broker URL form (one server or a cluster), with broker_url's fallbacks."""
    p.add_argument(
        "--broker",
        help=f"{whose} broker URL: redis://, rediss://, unix:// or redis+cluster://HOST:PORT,HOST:PORT "
        "(default: $STREAMRL_BROKER_URL, else the broker of the `streamrl up` in --run-dir, else the config's "
        "broker.url with its password_env or password_file)",
    )


def add_preflight_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-preflight",
        dest="preflight",
        action="store_false",
        help="skip the checks against this machine (reward.fn imports, files and model.path exist, "
        "the broker answers, vLLM imports, CUDA where asked for; streamrl/launch/preflight.py)",
    )


def preflight(args, cfg: Config) -> None:
    """Raise ConfigError naming every problem streamrl/launch/preflight.py finds, unless --no-preflight."""
    from streamrl.launch.preflight import require

    if args.preflight:
        require(cfg)


def add_section_flag(p: argparse.ArgumentParser, flag: str, section: type, field: str, help: str) -> None:
    """A flag for one field of a config section, whose default is the section's (one source of truth):
    it parses to None when not given, and `given(args, ...)` leaves the field to the section."""
    name = next(n for n, f in Config.model_fields.items() if f.annotation is section)
    info = section.model_fields[field]
    p.add_argument(
        flag,
        dest=field,
        type=type(info.default),
        default=None,
        help=f"{help} (default: the {name} section's {field}, {info.default})",
    )


def given(args, *fields: str) -> dict:
    """The section fields set by a flag (add_section_flag): pass them to the section, which fills the rest."""
    return {f: getattr(args, f) for f in fields if getattr(args, f) is not None}


def add_attach_args(p: argparse.ArgumentParser, fn_metavar: str, fn_help: str) -> None:
    """The flags of a command that attaches user code (--fn) to a running job: `streamrl env`, `streamrl reward`."""
    p.add_argument("--fn", required=True, metavar=fn_metavar, help=fn_help)
    p.add_argument("--run", required=True, help="run name (run.name of the job)")
    add_broker_arg(p)
    p.add_argument("--run-dir", help="run directory of a `streamrl up` (for its broker URL and logs)")


def quiet_progress_bars() -> None:
    """No tqdm bars from transformers ("Loading weights" per model load) or the hub on the console of
    `up` and `sft`, nor in the logs of the roles they start (they inherit the variable); a user's
    HF_HUB_DISABLE_PROGRESS_BARS=0 keeps them (a hub model that transformers or vLLM downloads then shows
    its download bar again)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] != "1":
        return
    if "huggingface_hub" in sys.modules:  # imported already: it read the variable before it was set
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging

        logging.disable_progress_bar()
