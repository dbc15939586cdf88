"""Imports point one way: the rules of docs/architecture.md, section "Rules", read statically from the
source of streamrl/, workers/, brokers/ and bench/ with `ast`; nothing is imported.

    pytest tests/unit/test_import_graph.py -q

Which imports count:
- every `import x` / `from x import y` statement, module-level or inside a function, including
  `if TYPE_CHECKING:` blocks, for the rules about *what* may be imported (bench, unittest.mock, and
  workers/brokers from streamrl at module level);
- for cycles, the same: module level (class bodies included), inside functions and under
  `if TYPE_CHECKING:`. A lazy or type-only import hides a cycle from Python, not from the reader
  (config <-> losses was function-level one way and TYPE_CHECKING the other; recovery <->
  supervisor function-level), and the two modules still cannot be understood or moved apart.
  `from pkg import name` is an edge to pkg.name when that is a module, else to pkg; a package's own
  __init__, run by importing one of its submodules, is not an edge (it is the package's facade);
- imports by name: `import_module("pkg.mod")` with a literal, and a `"pkg.mod"` / `"pkg.mod:attr"`
  string naming a module of this tree (a registry entry handed to a resolver). They count for the
  folder rules and the rules about bench, roles and commands; cycles skip them (a registry's plugins
  import its protocol back), except a plugin loop through a third module
  (test_registries_are_not_imported_back_...).

The folder rules (test_each_folder_imports_only_the_layers_below_it): stage folders import only
streamrl.core, config, models, losses, weights, tasks, eval (SHARED) and their own folder; core and config only
core and config; brokers only core and config. Crossings not yet moved are listed in TO_MOVE.
"""

from __future__ import annotations

import ast
import functools
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("streamrl", "workers", "brokers", "bench")


@dataclass(frozen=True)
class Imp:
    source: str
    target: str
    line: int
    module_level: bool
    """Not inside a function (class bodies and TYPE_CHECKING blocks are module level)."""
    type_checking: bool
    """Under `if TYPE_CHECKING:`: read by type checkers only, never run."""
    by_name: bool = False
    """A lazy import by name: `import_module("pkg.mod")` with a literal, or a `"pkg.mod:attr"` / `"pkg.mod"`
    string of this tree handed to a resolver (a registry of roles, stores, adapters)."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _is_import_module(func: ast.expr) -> bool:
    return (isinstance(func, ast.Name) and func.id == "import_module") or (
        isinstance(func, ast.Attribute) and func.attr == "import_module"
    )


def imports_of(name: str, path: Path, known: set[str]) -> list[Imp]:
    is_pkg = path.name == "__init__.py"
    out: list[Imp] = []

    def resolve(node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = name.split(".") if is_pkg else name.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def visit(node: ast.AST, in_function: bool, in_type_checking: bool) -> None:
        for child in ast.iter_child_nodes(node):
            func = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit_stmt(stmt, func, True)
                for stmt in child.orelse:
                    visit_stmt(stmt, func, in_type_checking)
                continue
            visit_stmt(child, func, in_type_checking)

    def visit_stmt(child: ast.AST, in_function: bool, in_type_checking: bool) -> None:
        record = dict(module_level=not in_function, type_checking=in_type_checking)
        if isinstance(child, ast.Import):
            for alias in child.names:
                out.append(Imp(name, alias.name, child.lineno, **record))
        elif isinstance(child, ast.ImportFrom):
            base = resolve(child)
            for alias in child.names:
                sub = f"{base}.{alias.name}"
                out.append(Imp(name, sub if sub in known else base, child.lineno, **record))
        elif isinstance(child, ast.Call) and _is_import_module(child.func) and child.args:
            arg = child.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                out.append(Imp(name, arg.value, child.lineno, False, False, by_name=True))
        elif isinstance(child, ast.JoinedStr):
            return  # f-string pieces ("workers:" in a key) are not module names
        elif isinstance(child, ast.Constant) and isinstance(child.value, str):
            # a `pkg.mod` / `pkg.mod:attr` spec of this tree, handed to a resolver (import_spec, _load)
            spec = child.value.partition(":")[0]
            if "." in spec and spec in known and spec != name:
                out.append(Imp(name, spec, child.lineno, False, False, by_name=True))
        visit(
            child,
            in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)),
            in_type_checking,
        )

    visit(ast.parse(path.read_text(), str(path)), False, False)
    return out


def all_imports() -> list[Imp]:
    mods = modules()
    return [imp for name, path in mods.items() for imp in imports_of(name, path, set(mods))]


def top(name: str) -> str:
    return name.split(".")[0]


def where(imp: Imp) -> str:
    return f"{modules()[imp.source].relative_to(ROOT)}:{imp.line} imports {imp.target}"


def test_the_graph_reader_sees_every_kind_of_import(tmp_path):
    # A guard for the rules below: a reader that missed function-level, relative or TYPE_CHECKING
    # imports would make them pass vacuously.
    src = (
        "from __future__ import annotations\nfrom typing import TYPE_CHECKING\nfrom . import b\n"
        "if TYPE_CHECKING:\n    from streamrl.config.schema import Config\n"
        "class K:\n    import json\n"
        "def f():\n    from bench.common import pyplot\n    import unittest.mock\n"
    )
    path = tmp_path / "a.py"
    path.write_text(src)
    got = {(i.target, i.module_level, i.type_checking) for i in imports_of("pkg.a", path, {"pkg.b"})}
    assert got == {
        ("__future__", True, False),
        ("typing", True, False),
        ("pkg.b", True, False),
        ("streamrl.config.schema", True, True),
        ("json", True, False),
        ("bench.common", False, False),
        ("unittest.mock", False, False),
    }
    edges = all_imports()
    assert len(modules()) > 50 and len(edges) > 300
    assert any(not i.module_level for i in edges) and any(i.type_checking for i in edges)


def test_no_import_cycle():
    graph: dict[str, set[str]] = {}
    for imp in all_imports():
        # by-name lookups are registries (roles, stores, adapters) whose entries import the registry's
        # protocol back: that is plugin wiring, not a cycle of understanding
        if imp.target in modules() and imp.target != imp.source and not imp.by_name:
            graph.setdefault(imp.source, set()).add(imp.target)
    # iterative DFS; report one cycle as a chain of modules
    color, stack_of, cycles = {}, [], []

    def dfs(start: str) -> None:
        work = [(start, iter(sorted(graph.get(start, ()))))]
        color[start], stack_of[:] = 1, [start]
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is None:
                color[node] = 2
                work.pop()
                stack_of.pop()
            elif color.get(nxt) == 1:
                cycles.append(stack_of[stack_of.index(nxt) :] + [nxt])
            elif nxt not in color:
                color[nxt] = 1
                stack_of.append(nxt)
                work.append((nxt, iter(sorted(graph.get(nxt, ())))))

    for mod in sorted(modules()):
        if mod not in color:
            dfs(mod)
    assert not cycles, (
        "import cycles (lazy and TYPE_CHECKING imports count; move the shared piece into a "
        "module both can import): " + "; ".join(" -> ".join(c) for c in cycles)
    )


def test_nothing_imports_bench():
    bad = [where(i) for i in all_imports() if top(i.target) == "bench" and top(i.source) != "bench"]
    assert not bad, (
        "streamrl/, workers/ and brokers/ must not import bench/ (move what they need into "
        f"streamrl/ and let bench import it from there): {bad}"
    )


def _folder_of(name: str) -> str:
    """`streamrl.launch.runtime` -> `streamrl.launch`; `workers.trainer` -> `workers`."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "streamrl" else parts[0]


def test_roles_never_import_launch_or_commands():
    # launch and commands are the composition root: they start the roles; a role that imports them
    # (to serve itself, to reach a helper) turns the root into a library and the arrow around
    bad = [
        where(i)
        for i in all_imports()
        if top(i.source) == "workers" and _folder_of(i.target) in ("streamrl.launch", "streamrl.commands")
    ]
    assert not bad, (
        "roles (workers/) must not import streamrl.launch or streamrl.commands: take what the launcher hands "
        f"in (streamrl/launch/runtime.py), or move the library piece out of the command: {bad}"
    )


def test_bench_never_imports_commands():
    # a bench measures the library; a helper it needs from a command is library code in the wrong place
    bad = [where(i) for i in all_imports() if top(i.source) == "bench" and _folder_of(i.target) == "streamrl.commands"]
    assert not bad, f"bench/ must not import streamrl.commands (move the helper into the library): {bad}"


def test_dependencies_point_from_workers_and_brokers_to_streamrl():
    imps = all_imports()
    # brokers implement streamrl's broker protocol: they never need a role
    bad = [where(i) for i in imps if top(i.source) == "brokers" and top(i.target) == "workers"]
    # streamrl reaches workers/brokers only lazily (composition root: CLI, supervisor, commands)
    bad += [
        where(i)
        for i in imps
        if top(i.source) == "streamrl" and top(i.target) in ("workers", "brokers") and i.module_level
    ]
    assert not bad, f"imports against the dependency direction (docs/architecture.md, Rules): {bad}"


def test_no_unittest_mock_outside_tests():
    files = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    bad = []
    for rel in files:
        if rel.startswith("tests/"):
            continue
        path = ROOT / rel
        if not path.is_file():
            continue
        for imp in imports_of(rel, path, set()):
            if imp.target == "unittest.mock" or imp.target.startswith("unittest.mock.") or imp.target == "mock":
                bad.append(f"{rel}:{imp.line}")
        tree = ast.parse(path.read_text(), rel)
        bad += [
            f"{rel}:{n.lineno}"
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.module == "unittest" and any(a.name == "mock" for a in n.names)
        ]
    assert not bad, (
        f"unittest.mock is for tests only (real parts in production code; docs/architecture.md, Rules): {sorted(set(bad))}"
    )
    assert len(files) > 100


STAGES = (
    "feed",
    "eval",
    "generate",
    "envs",
    "annotate",
    "assemble",
    "train",
    "sft",
    "weights",
    "models",
    "losses",
    "tasks",
)
"""Folders of streamrl/ named for a stage of the data path (README's table), and the libraries below them."""
SHARED = ("core", "config", "models", "losses", "weights", "tasks", "eval")
"""What every stage may build on: wire types and plumbing, the config, the model/loss/weights libraries, the
tasks (items and scorers that feed, annotate, envs, eval and sft all read) and evaluation rounds (one folder
for the feature: the feeder embeds its issuer, the assembler its collector)."""
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("streamrl.config.files", "streamrl.losses.registry"): "the written config resolves loss: against its objective, "
    "which owns its settings class (per-objective loss settings); lazy: only when a run directory is written",
    ("streamrl.eval", "streamrl.launch.evaluate"): "the public name streamrl.eval.evaluate (the Python API's) for "
    "a checkpoint's evaluation, which composes an engine, the rewards and the feeder's items as only the launcher "
    "may; lazy: on first use of the name",
}
"""(importing module, imported module) -> why this crossing is needed. Keep it short: the fix for a
crossing is to move the shared piece into core (or the lower library)."""
TO_MOVE: set[tuple[str, str]] = set()
"""Crossings known and not yet moved: each is a shared piece in the wrong folder. Remove an entry when its piece
moves; test_to_move_is_still_needed keeps the set honest."""


def _folder(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if parts[0] == "streamrl" and len(parts) > 1 else None


def _rule_breaks() -> list[str]:
    bad = []
    for imp in all_imports():
        src, dst = _folder(imp.source), _folder(imp.target)
        tgt_top = top(imp.target)
        if tgt_top not in PACKAGES and tgt_top != "bench":
            continue  # third-party / stdlib
        if (imp.source, imp.target) in EXCEPTIONS or (imp.source, imp.target) in TO_MOVE:
            continue
        if src in STAGES:
            # a stage is a library the roles compose: it never reaches up to the launcher, the CLI, a role or
            # a broker, nor into another stage (which would fuse the two stages into one)
            if tgt_top != "streamrl" or (dst is not None and dst not in SHARED and dst != src):
                bad.append(f"stage {src}: {where(imp)}")
        elif src == "core":
            # core is the bottom layer every folder imports; importing anything above it makes a cycle of folders.
            # config is allowed: the worker base, consumer and trimming take their typed section, and
            # config imports only itself and core (the rule below), so the direction is still one way
            if tgt_top != "streamrl" or (dst is not None and dst not in ("core", "config")):
                bad.append(f"core: {where(imp)}")
        elif src == "config":
            # every process reads the config: a stage's module imported here is imported by everything, and a
            # stage that reads its section could not be understood (or moved) apart from the config
            if tgt_top != "streamrl" or (dst is not None and dst not in ("core", "config")):
                bad.append(f"config: {where(imp)}")
        elif top(imp.source) == "brokers":
            # a broker implements streamrl.core.broker's protocol, configured by the broker section; nothing else
            if tgt_top == "brokers":
                continue
            if tgt_top != "streamrl" or dst not in ("core", "config"):
                bad.append(f"brokers: {where(imp)}")
    return bad


def test_each_folder_imports_only_the_layers_below_it():
    # Module-level, function-level and lazy (import_module("..."), "pkg.mod:attr" specs) imports all count:
    # a lazy import still ties the two folders together for a reader and for a move.
    bad = _rule_breaks()
    assert not bad, (
        "imports across the floor plan (stage folders may import streamrl.core, config, models, losses, weights, "
        "tasks, eval and their own folder; core only core; brokers only core and config); move the shared piece into the "
        "lower layer:\n" + "\n".join(bad)
    )


def test_the_rule_reader_sees_lazy_imports(tmp_path):
    # A guard for the folder rules: lazy imports by name are what module-level readers miss.
    src = (
        "import importlib\nfrom importlib import import_module\n"
        "ROLES = {'x': 'pkg.b:Worker'}\n"
        "def f(name):\n    importlib.import_module('pkg.c')\n    import_module('json')\n"
        "    importlib.import_module(name)\n    return 'not.a.module'\n"
    )
    path = tmp_path / "a.py"
    path.write_text(src)
    got = {(i.target, i.module_level) for i in imports_of("pkg.a", path, {"pkg.b", "pkg.c"})}
    assert got == {
        ("importlib", True),
        ("pkg.b", False),
        ("pkg.c", False),
        ("json", False),
    }


def test_to_move_is_still_needed():
    # an entry whose import is gone would let the crossing come back unnoticed
    seen = {(i.source, i.target) for i in all_imports()}
    stale = sorted((TO_MOVE | set(EXCEPTIONS)) - seen)
    assert not stale, f"remove these from TO_MOVE/EXCEPTIONS in {Path(__file__).name}, the import is gone: {stale}"


def test_registries_are_not_imported_back_by_what_their_plugins_build_on():
    # A by-name registry (the env adapters) whose plugins import a module that imports the registry is a
    # runtime cycle the cycle test cannot see (it skips by-name edges): envs.base <-> envs.adapters was one.
    imps = all_imports()
    plugins = {(i.source, i.target) for i in imps if i.by_name and i.target.startswith(i.source + ".")}
    static: dict[str, set[str]] = {}
    for i in imps:
        if not i.by_name and i.target in modules():
            static.setdefault(i.source, set()).add(i.target)
    bad = [
        f"{registry} -> {plugin} -> {dep} -> {registry}"
        for registry, plugin in plugins
        for dep in static.get(plugin, ())
        if not dep.startswith(registry) and registry in static.get(dep, ())
    ]
    assert not bad, f"move what the plugins import out of the module that imports the registry: {bad}"
