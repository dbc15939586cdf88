"""Every broker key name comes from Keys (streamrl/core/broker.py): no module builds one of its own.

A key built elsewhere (`keys.prefix + "ledger:groups"`, f"streamrl:{run}:...") is invisible to a
reader of Keys and to docs/protocol.md's key table, and a rename misses it."""

from __future__ import annotations

import ast
from pathlib import Path

from streamrl.core.broker import Keys

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("streamrl", "workers", "brokers", "bench")
HOME = ROOT / "streamrl" / "core" / "broker.py"


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings or bare strings (prose, e.g. usage examples)."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }


def _key_builders(source: str) -> list[tuple[int, str]]:
    """(line, what) for each place in `source` that spells a key: a `streamrl:` string or f-string,
    or the run prefix of a Keys (`keys.prefix`, `self.keys.prefix`) used to build one."""
    tree = ast.parse(source)
    prose = _docstrings(tree)
    # The literal parts of an f-string are Constants too: the f-string is reported once, as a whole.
    prose |= {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            if node.value.startswith("streamrl:"):
                found.append((node.lineno, repr(node.value)))
        elif isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            if isinstance(first, ast.Constant) and str(first.value).startswith("streamrl:"):
                found.append((node.lineno, "f-string " + ast.unparse(node)))
        elif isinstance(node, ast.Attribute) and node.attr == "prefix":
            owner = node.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if name in ("keys", "k"):
                found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_the_scan_finds_each_way_of_building_a_key():
    code = (
        'a = keys.prefix + "ledger:groups"\n'
        'b = f"{self.keys.prefix}episode_state:{g}"\n'
        'c = f"streamrl:{run}:prompts"\n'
        'd = "streamrl:tiny:rollouts"\n'
        'def f():\n    """Reads streamrl:tiny:rollouts."""\n'
        "e = self.prefix + 'v'\n"
    )
    assert [line for line, _ in _key_builders(code)] == [1, 2, 3, 4]


def test_every_key_the_code_uses_comes_from_keys():
    offenders = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path == HOME:
                continue
            for line, what in _key_builders(path.read_text()):
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {what}")
    assert not offenders, (
        "these build broker key names outside Keys; add the key to Keys (streamrl/core/broker.py, "
        "with a docstring) and use it:\n" + "\n".join(offenders)
    )


def test_wire_key_names_unchanged():
    """External producers and dashboards read these: the attribute names may change, the keys not."""
    k = Keys("r")
    assert k.trainer_released == "streamrl:r:trainer:released"
    assert k.trainer_checkpointed == "streamrl:r:trainer:checkpointed"
    assert (k.ledger_groups, k.ledger_steps, k.ledger_group_starts) == (
        "streamrl:r:ledger:groups",
        "streamrl:r:ledger:steps",
        "streamrl:r:ledger:group_starts",
    )
    assert k.eval_issued == "streamrl:r:eval:issued"
    assert k.episode_state("g1") == "streamrl:r:episode_state:g1"
    assert k.worker("producer", "judge-*") == "streamrl:r:workers:producer:judge-*"
    assert k.workers_prefix + "*" == "streamrl:r:workers:*"
