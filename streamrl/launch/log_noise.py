"""Exit noise the supervisor removes from a dead role's RUN_DIR/logs/<id>.out.

Triton's bindings (imported by torch._dynamo, so by every role that loads transformers) leak their
nanobind types on purpose, and nanobind reports that at interpreter exit: ~70 lines ("nanobind:
leaked 64 types!", " - leaked function ...") at the end of every role's output, after the
traceback that matters. Nothing in Python turns that report off (it is printed after the last
atexit hook, from a C++ destructor), so once the process is gone the supervisor drops exactly
those lines from the tail of its log, before quoting the tail in an error.

    strip_leak_report(Path("runs/x/logs/trainer-0.out"))   # -> number of lines removed
"""

from __future__ import annotations

import re
from pathlib import Path

TAIL_BYTES = 256 * 1024
"""Only the end of the log is searched: the report is the last thing a process prints."""

_REPORT = re.compile(
    rb"^(nanobind: leaked \d+ \w+!"
    rb"| - leaked \w+ .*"
    rb"| - \.\.\. skipped remainder"
    rb"|nanobind: this is likely caused by a reference counting issue in the binding code\."
    rb"|See https://nanobind\.readthedocs\.io/en/latest/refleaks\.html)$"
)


def strip_leak_report(path: Path) -> int:
    """Remove nanobind's leak-report lines from the last TAIL_BYTES of `path`; the number removed."""
    try:
        with open(path, "r+b") as fh:
            size = fh.seek(0, 2)
            start = max(0, size - TAIL_BYTES)
            fh.seek(start)
            tail = fh.read()
            if b"nanobind: leaked" not in tail:
                return 0
            if start:  # begin at a whole line
                cut = tail.find(b"\n") + 1
                start, tail = start + cut, tail[cut:]
            lines = tail.splitlines(keepends=True)
            keep = [ln for ln in lines if not _REPORT.match(ln.rstrip(b"\r\n"))]
            fh.seek(start)
            fh.write(b"".join(keep))
            fh.truncate()
            return len(lines) - len(keep)
    except OSError:
        return 0
