"""Helpers shared by subcommands: config arguments, loading, the tiny-model cache, broker URL lookup."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from streamrl.config.files import load_config
from streamrl.config.schema import Config
from streamrl.core.cache import cache_dir
from streamrl.core.errors import ConfigError


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


def add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config (default: configs/tiny-cpu.yaml)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override one config value, e.g. --set trainer.steps=20 (repeatable)",
    )


def load(args) -> Config:
    overrides = list(args.overrides)
    if getattr(args, "run", None):
        overrides.append(f"run.name={args.run}")
    return load_config(args.config, overrides)


def resolve_model(cfg: Config) -> Config:
    """Set model.path (building the tiny offline model into the cache when it is unset)."""
    from streamrl.models.tiny import resolve_model_path

    path = resolve_model_path(cfg.model, cache_dir() / "models", cfg.run.seed)
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": str(path)})})


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
