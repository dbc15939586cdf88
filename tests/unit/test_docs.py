"""The docs name only what exists: every repository path and `streamrl.x` module in README.md and
docs/*.md, every relative link (and its #anchor), and the README stays a short map.

    pytest -q tests/unit/test_docs.py

A file renamed or split without its docs fails here, naming the doc, the line and the missing path.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 160

TOP = ("streamrl", "workers", "brokers", "configs", "bench", "tests", "docs", "examples", ".ci")
PATH = re.compile(r"(?<![\w./$~-])((?:" + "|".join(re.escape(t) for t in TOP) + r")/[\w./<>{}*-]*)")
"""A repository path: starts at a top-level folder (not inside another path, e.g. /dev/shm/streamrl-x)."""
MODULE = re.compile(r"(?<![\w./-])((?:streamrl|workers|brokers|bench)(?:\.\w+)+)")
"""A dotted module reference such as `streamrl.annotate.sdk.producer` or `python -m bench.trainer_mfu`."""
LINK = re.compile(r"\]\(([^)\s]+)\)")
PLACEHOLDER = re.compile(r"[<>{}*]")


def _name(doc: Path) -> str:
    return str(doc.relative_to(ROOT)) if doc.is_relative_to(ROOT) else doc.name


def _lines(doc: Path):
    yield from enumerate(doc.read_text().splitlines(), 1)


def _module_exists(dotted: str) -> bool:
    """The longest leading part of `dotted` that is a module or package; at least `top.module`."""
    parts = dotted.split(".")
    for i in range(len(parts), 1, -1):
        base = ROOT.joinpath(*parts[:i])
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            return True
    return False


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.DOTALL)
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.+)$", text, flags=re.MULTILINE)}


def missing_paths(doc: Path) -> list[str]:
    out = []
    for n, line in _lines(doc):
        for m in PATH.finditer(line):
            path = m.group(1).rstrip(".,;:)")
            if PLACEHOLDER.search(path):  # `streamrl/commands/<name>.py`: check the part before it
                path = PLACEHOLDER.split(path)[0].rsplit("/", 1)[0]
            if not (ROOT / path).exists():
                out.append(f"{_name(doc)}:{n}: {path}")
        for m in MODULE.finditer(line):
            if not _module_exists(m.group(1)):
                out.append(f"{_name(doc)}:{n}: module {m.group(1)}")
    return out


def broken_links(doc: Path, base: Path | None = None) -> list[str]:
    """`base`: the folder relative links start from (default: the doc's own)."""
    base = base or doc.parent
    out = []
    for n, line in _lines(doc):
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = doc if not file else (base / file).resolve()
            if not dest.exists():
                out.append(f"{_name(doc)}:{n}: link to {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                out.append(f"{_name(doc)}:{n}: link to {target}: no such heading")
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_path_exists(doc):
    missing = missing_paths(doc)
    assert not missing, "paths named in the docs that do not exist (renamed? fix the doc):\n" + "\n".join(missing)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(doc):
    broken = broken_links(doc)
    assert not broken, "\n".join(broken)


def test_readme_is_a_short_map_that_links_every_doc():
    readme = (ROOT / "README.md").read_text()
    lines = readme.count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines; keep it a map (<= {README_MAX_LINES}), move detail to docs/"
    )
    linked = {m.group(1).partition("#")[0] for m in LINK.finditer(readme)}
    unlinked = [p.name for p in DOCS[1:] if f"docs/{p.name}" not in linked]
    assert not unlinked, f"docs not linked from README.md: {unlinked}"
    assert "make run" in readme and "make test" in readme, "the quick start starts with `make run` and `make test`"


def test_the_checks_catch_what_they_claim_to(tmp_path):
    """The checker itself: a missing path, module, file link and anchor are each reported; templates,
    existing names and paths outside the repository are not."""
    doc = tmp_path / "probe.md"
    doc.write_text(
        "see `workers/no_such_file.py` and streamrl.no_such_module.fn\n"
        "[a](nope.md) [b](architecture.md#no-such-heading) [c](architecture.md#the-stages)\n"
        "fine: `streamrl/commands/<name>.py`, `streamrl/core/worker.py`, streamrl.annotate.sdk.producer, "
        "/dev/shm/streamrl-x/v1, `tests/unit/test_docs.py::test_x`.\n"
    )
    assert missing_paths(doc) == [
        "probe.md:1: workers/no_such_file.py",
        "probe.md:1: module streamrl.no_such_module.fn",
    ]
    assert broken_links(doc, base=ROOT / "docs") == [
        "probe.md:2: link to nope.md: no such file",
        "probe.md:2: link to architecture.md#no-such-heading: no such heading",
    ]
