"""What holds a role's asyncio loop: a sampling profiler of the loop thread's Python stack.

A daemon thread reads the loop thread's current frame (`sys._current_frames()`) every `interval_s`
and counts each distinct stack, keyed by its code objects only (no strings, no line numbers per
sample: names are formatted once, at the end). A sample is "blocked" when the loop's 20 ms timer
(streamrl/generate/loop_lag.py, `LoopLag.last_tick`) has not run for more than twice its period: the loop
was running one callback all that time, and the stack says which. The generator runs it with
`generator.loop_profile_s` > 0 and writes RUN_DIR/logs/<worker_id>.loop_profile.txt at stop
(docs/performance.md, "Weight sync").

    prof = LoopProfiler(0.005, loop_lag); prof.start()   # from a coroutine on the loop to profile
    ...; prof.stop(); prof.write(path); prof.summary()
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from types import CodeType

from streamrl.generate.loop_lag import LoopLag

DEPTH = 40
"""Innermost frames kept per sample; a deeper stack starts with a `(truncated)` frame."""
MAX_STACKS = 50_000
"""Distinct stacks kept per table; samples of further new stacks count under `(other_stacks)`."""
TRUNCATED, OTHER = "(truncated)", "(other_stacks)"


class LoopProfiler:
    def __init__(self, interval_s: float, lag: LoopLag, depth: int = DEPTH):
        self.interval_s = interval_s
        self.lag = lag
        """Its `last_tick` says when the loop last ran its timer; blocked = older than 2 periods."""
        self.depth = depth
        self.all: Counter[tuple] = Counter()
        self.blocked: Counter[tuple] = Counter()
        """Stack (code objects, innermost first) -> weight in intervals, of every / of blocked samples."""
        self.samples = 0
        self.blocked_samples = 0
        self.late = 0
        """Samples taken more than 2 intervals after the previous one: the sampler waited for the GIL
        (the loop thread in C code that holds it) or for a CPU."""
        self.cpu_s = 0.0
        """CPU time of the sampler thread itself (its overhead on the process)."""
        self._target: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Profile the calling thread (call it from a coroutine on the loop)."""
        self._target = threading.get_ident()
        self._thread = threading.Thread(target=self._run, name="loop-profiler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        cpu0 = time.thread_time()
        interval, limit = self.interval_s, 2 * self.lag.period_s
        prev, owed = time.monotonic(), 0.0
        while not self._stop.wait(interval):
            now = time.monotonic()
            frame = sys._current_frames().get(self._target)
            if frame is None:  # the loop thread has ended
                break
            # A late sample stands for every interval since the previous one (the remainder carried
            # over), so weights add up to time even when the sampler could not run on time.
            owed += (now - prev) / interval
            weight = max(1, round(owed))
            owed -= weight
            self.late += weight > 2
            prev = now
            codes = []
            while frame is not None and len(codes) < self.depth:
                codes.append(frame.f_code)
                frame = frame.f_back
            if frame is not None:
                codes.append(TRUNCATED)
            key = tuple(codes)
            del frame, codes
            self.samples += 1
            _add(self.all, key, weight)
            tick = self.lag.last_tick
            if tick is not None and now - tick > limit:
                self.blocked_samples += 1
                _add(self.blocked, key, weight)
        self.cpu_s += time.thread_time() - cpu0

    # -- results (formatted once, at the end) ---------------------------------------------
    def top(self, n: int = 20) -> list[tuple[str, int, float, float]]:
        """(function, inclusive weight, its share, self share) of the blocked samples, heaviest first
        and, among equals, the innermost first. Only frames inside the callback the loop was running
        count: the loop's own frames (asyncio.run ... Handle._run) are in every sample."""
        total = max(sum(self.blocked.values()), 1)
        inclusive: Counter[str] = Counter()
        own: Counter[str] = Counter()
        depth: dict[str, int] = {}
        for key, weight in list(self.blocked.items()):  # list: a sampler that outlived stop() may still add
            inner = _inside_callback(key)
            for i, code in enumerate(reversed(inner)):
                name = function_name(code)
                depth[name] = max(depth.get(name, 0), i)
            for name in {function_name(c) for c in inner}:  # a recursive function counts once per sample
                inclusive[name] += weight
            if inner:
                own[function_name(inner[0])] += weight
        ranked = sorted(inclusive, key=lambda name: (-inclusive[name], -depth[name]))[:n]
        return [
            (name, inclusive[name], round(inclusive[name] / total, 4), round(own[name] / total, 4)) for name in ranked
        ]

    def summary(self, n: int = 5) -> dict:
        """Counts and the top-`n` blocked functions, for the generator's stats and `stopped` line."""
        return {
            "loop_profile_samples": self.samples,
            "loop_profile_blocked_samples": self.blocked_samples,
            "loop_profile_late_samples": self.late,
            "loop_profile_cpu_s": round(self.cpu_s, 3),
            "loop_profile_top_blocked": [f"{name} {share:.1%}" for name, _, share, _ in self.top(n)],
        }

    def write(self, path: Path, title: str = "") -> Path:
        """The profile as text: a header, the top blocked functions, then blocked and all stacks as
        collapsed (flamegraph) lines `outer;...;inner weight`; every other line starts with `#`."""
        blocked_w, all_w = sum(self.blocked.values()), sum(self.all.values())
        lines = [
            f"# loop profile {title}".rstrip(),
            f"# interval {self.interval_s} s; blocked: the loop's {self.lag.period_s} s timer had not run for "
            f"> {2 * self.lag.period_s} s; weights are intervals (a late sample counts for the time it covers)",
            f"# samples {self.samples} (weight {all_w}), blocked samples {self.blocked_samples} "
            f"(weight {blocked_w}), late samples {self.late}, sampler cpu {self.cpu_s:.3f} s",
            "# top blocked functions, inside the loop's callback: inclusive share, weight, self share, function",
            *(f"# {share:7.2%} {w:8d} {own:7.2%} {name}" for name, w, share, own in self.top(30)),
            "# blocked stacks",
            *_collapsed(self.blocked),
            "# all stacks",
            *_collapsed(self.all),
        ]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
        return path


def _add(table: Counter, key: tuple, weight: int) -> None:
    if key in table or len(table) < MAX_STACKS:
        table[key] += weight
    else:
        table[(OTHER,)] += weight


def _inside_callback(key: tuple) -> tuple:
    """The innermost frames of a stack up to (without) the event loop's own: the callback's. asyncio
    runs a callback from Handle._run; uvloop's loop is C, so there the callback sits right under
    the Python frame that started the loop (asyncio's Runner.run, uvloop.run, run_until_complete)."""
    for i, code in enumerate(key):
        if isinstance(code, CodeType) and code.co_name in _LOOP_NAMES and code.co_filename.endswith(_LOOP_FILES):
            return key[:i]
    return key


_LOOP_FILES = (
    os.path.join("asyncio", "events.py"),
    os.path.join("asyncio", "base_events.py"),
    os.path.join("asyncio", "runners.py"),
    os.path.join("uvloop", "__init__.py"),
)
_LOOP_NAMES = frozenset({"_run", "_run_once", "run_forever", "run_until_complete", "run"})


def _file(code: CodeType) -> str:
    base = os.path.basename(code.co_filename)
    if base == "__init__.py":  # the package's name says more than its __init__
        base = os.path.basename(os.path.dirname(code.co_filename)) + "/" + base
    return base.replace(" ", "_").replace(";", ",")


def function_name(code: CodeType | str) -> str:
    """`file:qualname:first line` of a code object (the unit of the top list)."""
    if isinstance(code, str):
        return code
    return f"{_file(code)}:{code.co_qualname}:{code.co_firstlineno}"


def _frame_name(code: CodeType | str) -> str:
    return code if isinstance(code, str) else f"{_file(code)}:{code.co_qualname}".replace(" ", "_")


def _collapsed(table: Counter) -> list[str]:
    """Collapsed lines, outermost frame first, heaviest first (names that differ only by line merge)."""
    merged: Counter[str] = Counter()
    for key, weight in list(table.items()):
        merged[";".join(_frame_name(c) for c in reversed(key))] += weight
    return [f"{stack} {weight}" for stack, weight in merged.most_common()]


def read_profile(path: Path) -> dict[str, dict[str, int]]:
    """{"blocked": {stack: weight}, "all": {...}} from a written profile (tests, scripts)."""
    out: dict[str, dict[str, int]] = {"blocked": {}, "all": {}}
    headers = {"# blocked stacks": "blocked", "# all stacks": "all"}
    section = None
    for line in Path(path).read_text().splitlines():
        if line in headers:
            section = headers[line]
        elif section is None and line.startswith("#"):
            continue  # the header and the top list
        else:
            stack, _, weight = line.rpartition(" ")
            if not stack or not weight.isdigit():
                raise ValueError(f"{path}: not a collapsed-stack line `stack weight`: {line!r}")
            out[section][stack] = int(weight)
    return out
