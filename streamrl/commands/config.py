"""`streamrl config`: validate a config (file + --set overrides) and print it fully resolved."""

from __future__ import annotations

from streamrl.commands.common import add_config_args, add_preflight_arg, load, preflight

NAME = "config"
HELP = "validate a config and print it fully resolved"
DESCRIPTION = (
    "Validate a config, check it against this machine (streamrl/launch/preflight.py), and print every "
    "field with its resolved value (nothing starts)."
)


def add_arguments(p) -> None:
    add_config_args(p)
    add_preflight_arg(p)


def run(args) -> int:
    import yaml

    cfg = load(args)
    preflight(args, cfg)
    print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), end="")
    return 0
