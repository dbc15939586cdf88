"""The docs name only what exists: every repository path and `streamrl.x` module in README.md,
docs/*.md and docs/benchmarks/*.md, every relative link (and its #anchor); the README stays a short
map, docs/architecture.md names every folder of the code, docs/performance.md stays one table of
current figures (campaigns in dated files), and no doc names a machine path or a branch.

    pytest -q tests/unit/test_docs.py

A file renamed or split without its docs fails here, naming the doc, the line and the missing path.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import streamrl

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CAMPAIGNS = sorted((ROOT / "docs" / "benchmarks").glob("*_*_*.md"))
ALL_DOCS = [*DOCS, *CAMPAIGNS, ROOT / "docs" / "benchmarks" / "README.md"]
README_MAX_LINES = 160
PERFORMANCE_MAX_LINES = 200
CAMPAIGN_NAME = re.compile(r"[a-z0-9-]+_[a-z0-9-]+_\d{4}-\d{2}-\d{2}\.md")
"""docs/benchmarks/<topic>_<hardware>_<date>.md, as torchtitan's benchmarks/ names its files."""
FIGURES_HEADER = "| figure | value | command | hardware | date | commit |"
MACHINE_PATH = re.compile(r"(?<![\w.~$-])/(?:tmp|work|root|home)/\S+")
"""A path on one machine (`/tmp/h21b-base`, `/work/wt/x`): a reader's machine has none of them. The
sandbox's own `/tmp` and `/root` (docs/sandbox.md), with nothing after them, are not machine paths."""
BRANCH = re.compile(r"\bh\d{1,2}[a-z]\w*\b|\bbranch(?:es)? [`'\"]?(?!of\b|and\b|or\b)[\w/-]*\d")
"""A working branch's name (`h21b`, `branch h13b`): gone once merged; name the commit instead."""

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
    if parts[0] == "streamrl" and parts[1] in streamrl.__all__:  # the Python API: streamrl.run, streamrl.Config, ...
        return True
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


def machine_paths_and_branches(doc: Path) -> list[str]:
    out = []
    for n, line in _lines(doc):
        for m in [*MACHINE_PATH.finditer(line), *BRANCH.finditer(line)]:
            out.append(f"{_name(doc)}:{n}: {m.group(0)}")
    return out


def code_folders() -> list[str]:
    """Every package folder of the library, as the docs write it: `streamrl/core/`, `streamrl/envs/sandbox/`."""
    return sorted(
        f"{init.parent.relative_to(ROOT).as_posix()}/"
        for init in (ROOT / "streamrl").rglob("__init__.py")
        if init.parent != ROOT / "streamrl"
    )


@pytest.mark.parametrize("doc", ALL_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_path_exists(doc):
    missing = missing_paths(doc)
    assert not missing, "paths named in the docs that do not exist (renamed? fix the doc):\n" + "\n".join(missing)


@pytest.mark.parametrize("doc", ALL_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(doc):
    broken = broken_links(doc)
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("doc", ALL_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_machine_paths_or_branch_names(doc):
    found = machine_paths_and_branches(doc)
    assert not found, (
        "machine paths or branch names in the docs (write `$BASE`/`$NEW`/`out/` and `main at <commit>`):\n"
        + "\n".join(found)
    )


def test_architecture_names_every_folder_of_the_code():
    text = (ROOT / "docs" / "architecture.md").read_text()
    folders = code_folders()
    assert "streamrl/core/" in folders and "streamrl/envs/sandbox/" in folders, folders  # the walk itself works
    named = [f for f in folders if f in text or f.replace("streamrl/envs/", "") in text]
    unnamed = sorted(set(folders) - set(named))
    assert not unnamed, (
        f"folders of streamrl/ that docs/architecture.md does not name (add them to its floor plan): {unnamed}"
    )
    for top in ("workers/", "brokers/"):
        assert f"`{top}`" in text, f"docs/architecture.md's floor plan does not name `{top}`"


def test_performance_is_one_table_of_current_figures():
    text = (ROOT / "docs" / "performance.md").read_text()
    lines = text.count("\n")
    assert lines <= PERFORMANCE_MAX_LINES, (
        f"docs/performance.md has {lines} lines (<= {PERFORMANCE_MAX_LINES}): move a campaign's runs to "
        "docs/benchmarks/<topic>_<hardware>_<date>.md and keep one row per figure"
    )
    assert FIGURES_HEADER in text, f"docs/performance.md has no table of current figures ({FIGURES_HEADER})"
    rows = text.split(FIGURES_HEADER, 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    assert len(rows) >= 10, f"the figures table has {len(rows)} rows"
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split(" | ")]
        assert len(cells) == 6, f"a figures row needs 6 cells (figure, value, command, hardware, date, commit): {row}"
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", cells[4]), f"date is not YYYY-MM-DD: {row}"
        assert re.fullmatch(r"[0-9a-f]{7,40}(, [0-9a-f]{7,40})*", cells[5]), f"commit is not a short hash: {row}"


def test_every_campaign_is_a_dated_file_in_the_index():
    names = [p.name for p in (ROOT / "docs" / "benchmarks").glob("*.md") if p.name != "README.md"]
    misnamed = [n for n in names if not CAMPAIGN_NAME.fullmatch(n)]
    assert not misnamed, f"campaign files are named <topic>_<hardware>_<YYYY-MM-DD>.md: {misnamed}"
    index = (ROOT / "docs" / "benchmarks" / "README.md").read_text()
    unlisted = [n for n in names if f"]({n})" not in index]
    assert not unlisted, f"campaigns not listed in docs/benchmarks/README.md: {unlisted}"
    assert len(names) >= 10, names


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


def test_machine_paths_and_branch_names_are_caught(tmp_path):
    doc = tmp_path / "probe.md"
    doc.write_text(
        "base in /tmp/h21b-base, run from /work/wt/x and /root/.cache/y\n"
        "new = branch h13b; measured on h22s\n"
        "fine: /dev/shm/psm_*, `/tmp` inside the sandbox, no `/root`, $BASE, out/w, H200, nvidia-h200-x2, "
        "a branch of the code, streamrl/core/worker.py\n"
    )
    assert machine_paths_and_branches(doc) == [
        "probe.md:1: /tmp/h21b-base,",
        "probe.md:1: /work/wt/x",
        "probe.md:1: /root/.cache/y",
        "probe.md:1: h21b",
        "probe.md:2: branch h13",
        "probe.md:2: h22s",
    ]
