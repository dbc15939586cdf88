"""`streamrl config`: validate a config (file + --set overrides) and print it fully resolved."""

from __future__ import annotations

import sys

from streamrl.commands.common import add_preflight_arg, preflight
from streamrl.config.args import add_config_args, load

NAME = "config"
HELP = "validate a config and print it fully resolved"
DESCRIPTION = (
    "Validate a config, check it against this machine (streamrl/launch/preflight.py), and print every "
    "field with its resolved value (nothing starts)."
)


def add_arguments(p) -> None:
    add_config_args(p)
    add_preflight_arg(p)
    p.add_argument(
        "--explain",
        nargs="*",
        metavar="SECTION",
        help="print each field with its description (from the schema's docstrings); with SECTION names "
        "(e.g. --explain trainer judge) only those sections",
    )


def run(args) -> int:
    import yaml

    from streamrl.config.explain import explain
    from streamrl.config.files import resolved_dump
    from streamrl.losses import resolve_loss

    cfg = load(args)
    if warning := cfg.broker.inline_password_warning():
        print(warning, file=sys.stderr)
    preflight(args, cfg)
    data = resolved_dump(cfg)  # as RUN_DIR/config.yaml will hold it: the objective's defaults applied
    if args.explain is not None:
        from streamrl.launch.placement import describe, host_gpu_count
        from streamrl.models.chat_template import prompt_format

        notes = {"task.chat_template": prompt_format(cfg)}
        print(explain(data, cfg, resolve_loss(cfg), notes, args.explain), end="")
        print(describe(cfg, host_gpu_count()), end="")
    else:
        print(yaml.safe_dump(data, sort_keys=False), end="")
    return 0
