"""The console of `streamrl up` between starting the roles and the first step.

A GPU job's generator takes one to two minutes to start vLLM (imports, torch.compile, CUDA graphs,
kernel warm-up: docs/benchmarks/gpu-round9_h100_2026-12-07.md). Without this watch, that time is
silence on the console. The watch says when each role is ready, how long a generator's engine took,
and every 30 s which roles are still starting. It reads what the roles append to their structured
logs (RUN_DIR/logs/<worker id>.jsonl) after it was made (a resumed run's logs hold the earlier runs'
lines) and stops once the first step is in.

    watch = StartupWatch(run_dir, started_at=t0, every_s=30)
    for line in watch.poll(workers=["trainer-0", "generator-0"], first_step_seen=False):
        print(line)

    trainer-0 ready, 43.2s after the command
    generator-0 ready, 129.4s after the command (vLLM engine start 88.7s)
    still starting, 60s after the command: waiting for generator-0
"""

from __future__ import annotations

import json
import time
from pathlib import Path

EVERY_S = 30.0
"""How often the console repeats which roles are still starting."""


def ready_line(worker_id: str, after_s: float, engine_s: float | None) -> str:
    """The console line for a role that has started (it logged `started`); pure."""
    engine = f" (vLLM engine start {engine_s:.1f}s)" if engine_s is not None else ""
    return f"{worker_id} ready, {after_s:.1f}s after the command{engine}"


def waiting_line(after_s: float, waiting: list[str]) -> str:
    """The console line while some roles have not started; pure."""
    return f"still starting, {after_s:.0f}s after the command: waiting for {', '.join(waiting)}"


class StartupWatch:
    def __init__(self, run_dir: Path, started_at: float | None = None, every_s: float = EVERY_S):
        self.logs = Path(run_dir) / "logs"
        self.started_at = started_at if started_at is not None else time.time()
        """When the command started (time.time()); the lines count from it."""
        self.every_s = every_s
        self.ready: set[str] = set()
        # A resumed run appends to the logs of the runs before it: only what this one writes is read.
        self._offsets: dict[Path, int] = {p: p.stat().st_size for p in self.logs.glob("*.jsonl")}
        self._engine_s: dict[str, float] = {}
        self._said_at = time.monotonic()
        self.done = False
        """Set once the first step is in: the watch then says nothing more."""

    def poll(self, workers: list[str], first_step_seen: bool) -> list[str]:
        """Lines to print now. `workers`: the ids of the roles `up` runs; `first_step_seen`: whether
        the console has shown a step (the watch stops then)."""
        if self.done:
            return []
        if first_step_seen:
            self.done = True
            return []
        lines = []
        for worker_id in self._newly_started():
            lines.append(ready_line(worker_id, time.time() - self.started_at, self._engine_s.get(worker_id)))
        waiting = [w for w in workers if w not in self.ready]
        if waiting and time.monotonic() - self._said_at >= self.every_s:
            lines.append(waiting_line(time.time() - self.started_at, waiting))
        if lines:
            self._said_at = time.monotonic()
        return lines

    def _newly_started(self) -> list[str]:
        """Roles whose `started` record appeared since the last poll; a generator's engine start time
        (its `engine_started` record) is kept for its line."""
        started = []
        for path in sorted(self.logs.glob("*.jsonl")):
            for rec in self._new_records(path):
                worker_id = rec.get("worker_id")
                if not isinstance(worker_id, str):
                    continue
                if rec.get("event") == "engine_started" and isinstance(rec.get("seconds"), (int, float)):
                    self._engine_s[worker_id] = float(rec["seconds"])
                elif rec.get("event") == "started" and worker_id not in self.ready:
                    self.ready.add(worker_id)
                    started.append(worker_id)
        return started

    def _new_records(self, path: Path) -> list[dict]:
        """The complete lines appended to `path` since the last read (a line still being written
        waits for the next poll)."""
        try:
            with open(path, "rb") as f:
                f.seek(self._offsets.get(path, 0))
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1
        self._offsets[path] = self._offsets.get(path, 0) + end
        out = []
        for line in data[:end].splitlines():
            if b'"started"' not in line and b'"engine_started"' not in line:
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a line cut by a crash
        return out
