"""One module per `streamrl` subcommand. Each defines `NAME`, `HELP`, `add_arguments(parser)` and
`run(args) -> int`; streamrl.cli lists them in COMMANDS and imports them lazily."""

import importlib


def load_modules(package: str, names: list[str]) -> dict:
    """Import `package.name` for each name, skipping modules that do not exist (an import error
    inside an existing module still raises)."""
    found = {}
    for name in names:
        try:
            found[name] = importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name not in (f"{package}.{name}", package):
                raise
    return found
