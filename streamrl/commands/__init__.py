"""One module per `streamrl` subcommand. Each defines `NAME`, `HELP`, `add_arguments(parser)` and
`run(args) -> int`; streamrl.cli lists them in COMMANDS and imports them lazily."""
