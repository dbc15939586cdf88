"""`streamrl bench NAME`: the benchmarks in bench/<name>.py. Each prints a table and, with
`--out DIR`, writes DIR/result.json (and PNG plots where it has them).

    streamrl bench broker --out /tmp/b      streamrl bench pipeline      streamrl bench weights
"""

from __future__ import annotations

from streamrl.commands import load_modules
from streamrl.config.args import prepare_out_dir

NAME = "bench"
BENCHES = [
    "broker",
    "pipeline",
    "e2e",
    "env",
    "weights",
    "weights_hosts",
    "soak",
    "objectives",
    "trainer_mfu",
    "sft_mfu",
    "peers",
]
"""Modules under bench/ exposing HELP, add_arguments(parser) and run(args) -> int."""
HELP = f"run a benchmark ({', '.join(BENCHES)})"
DESCRIPTION = "Benchmarks that print their numbers; `--out DIR` also writes DIR/result.json and plots."


def _benches() -> dict:
    return load_modules("bench", BENCHES)


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="bench", required=True)
    for name, mod in _benches().items():
        bp = sub.add_parser(name, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP))
        bp.add_argument("--out", help="write DIR/result.json (and plots) here")
        mod.add_arguments(bp)


def run(args) -> int:
    prepare_out_dir(args.out)  # a bad --out fails now, not after the whole run
    return _benches()[args.bench].run(args)
