"""`streamrl config`: validate a config (file + --set overrides) and print it fully resolved."""

from __future__ import annotations

from streamrl.commands.common import add_config_args, load

NAME = "config"
HELP = "validate a config and print it fully resolved"
DESCRIPTION = "Validate a config and print every field with its resolved value (nothing starts)."


def add_arguments(p) -> None:
    add_config_args(p)


def run(args) -> int:
    import yaml

    print(yaml.safe_dump(load(args).model_dump(mode="json"), sort_keys=False), end="")
    return 0
