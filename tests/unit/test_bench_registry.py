"""`streamrl bench`'s list of benches is its registry (BENCHES), and the registry matches bench/."""

from __future__ import annotations

import ast
from pathlib import Path

from streamrl.cli import build_parser
from streamrl.commands import bench

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


def _bench_modules() -> set[str]:
    """Modules in bench/ that define the bench interface (HELP, add_arguments, run), read without importing."""
    found = set()
    for path in BENCH_DIR.glob("*.py"):
        names = {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}
        names |= {
            t.id
            for n in ast.parse(path.read_text()).body
            if isinstance(n, ast.Assign)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        if {"HELP", "add_arguments", "run"} <= names:
            found.add(path.stem)
    return found


def test_registry_lists_every_bench_module():
    assert set(bench.BENCHES) == _bench_modules()


def test_top_level_help_names_every_bench():
    parser, _ = build_parser()
    help_text = " ".join(parser.format_help().split())
    assert f"run a benchmark ({', '.join(bench.BENCHES)})" in help_text
