"""Where a generator's restart goes: SIGKILL generator-0 of a real `streamrl up` (while it holds
prompt groups) and time its way back.

    python -m bench.recovery --steps 16 --kill-at 4                        # tiny CPU job, one generator
    python -m bench.recovery --steps 16 --kill-at 4 --set generator.count=2
    python -m bench.recovery --set supervisor.backoff_s=0.2 --out /tmp/recovery

Phases, from the run's own records: kill -> the supervisor's "restarting" line (its poll) -> the new
process starts (back-off) -> `engine_started` in generator-0.jsonl (imports + broker + vLLM start, vLLM's
own share is the event's `seconds`) -> first rollout from generator-0 in the broker -> the trainer's next
step. The trainer's stall is the longest step-to-step gap after the kill (metrics.jsonl `time_s`) minus
the median gap before it, and the summed `wait_s` of the steps after the kill. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import redis

from bench.jobs import ROOT, metrics, up_args
from streamrl.core.broker import Keys

RUN = "recovery"
"""The run name of the job this bench starts (its keys: Keys(RUN))."""


def _iso(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def _events(path: Path, after: float) -> list[dict]:
    out = []
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if "timestamp" in rec and _iso(rec["timestamp"]) >= after:
            out.append({**rec, "t": _iso(rec["timestamp"])})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--kill-at", type=int, default=4, help="SIGKILL generator-0 once this step is trained")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--out", help="folder for the run (default: a temporary one)")
    p.add_argument("--timeout", type=float, default=900)
    args = p.parse_args(argv)

    out_dir = Path(args.out or tempfile.mkdtemp(prefix="recovery-"))
    run_dir = out_dir / "run"
    # run.export=false: a benchmark needs no Hugging Face copy of the model
    cmd = up_args(run_dir, f"run.name={RUN}", "run.export=false", f"trainer.steps={args.steps}", *args.overrides)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(
        target=lambda: [lines.append((time.time(), ln.rstrip())) for ln in proc.stdout], daemon=True
    )
    reader.start()
    deadline = time.time() + args.timeout
    while not (metrics(run_dir) and metrics(run_dir)[-1]["step"] >= args.kill_at):
        if proc.poll() is not None or time.time() > deadline:
            sys.exit(f"the job ended before step {args.kill_at}:\n" + "\n".join(ln for _, ln in lines[-30:]))
        time.sleep(0.2)
    r = redis.Redis.from_url((run_dir / "broker" / "url").read_text().strip())
    keys = Keys(RUN)
    pid = json.loads(r.get(keys.worker("generator", "generator-0")))["pid"]
    # Kill it while it holds prompt groups (what a dead generator leaves for the others to take over).
    held, until = 0, time.time() + 30
    while held == 0 and time.time() < until:
        pending = r.xpending(keys.prompts, "generator")
        held = next((int(c["pending"]) for c in pending.get("consumers") or [] if c["name"] == b"generator-0"), 0)
        time.sleep(0.05)
    last_before = r.xrevrange(keys.rollouts, count=1)
    t_kill = time.time()
    os.kill(pid, signal.SIGKILL)
    first_rollout = None
    last_id = last_before[0][0] if last_before else b"0"
    while proc.poll() is None and time.time() < deadline:
        if first_rollout is None:
            try:
                for entry_id, fields in r.xrange(keys.rollouts, min=b"(" + last_id, count=500):
                    last_id = entry_id
                    if b"generator-0" in fields.get(b"d", b"") and first_rollout is None:
                        first_rollout = time.time()
            except redis.RedisError:
                pass
        time.sleep(0.1)
    code = proc.wait(max(1.0, deadline - time.time()))
    reader.join(5)
    (out_dir / "up.out").write_text("".join(f"{t:.2f} {ln}\n" for t, ln in lines))
    shm_left = [ln for t, ln in lines if "shared-memory segment" in ln]

    restart_line = next((t for t, ln in lines if t >= t_kill and "generator-0" in ln and "restarting in" in ln), None)
    log = _events(run_dir / "logs" / "generator-0.jsonl", t_kill)
    engine = next((e for e in log if e.get("event") == "engine_started"), None)
    offered = next((e.get("groups") for e in log if e.get("event") == "offered_previous_groups"), 0)
    started = next((e for e in log if e.get("event") == "started"), None)
    rows = metrics(run_dir)
    times = [m["time_s"] for m in rows]
    gaps = [b - a for a, b in zip(times, times[1:])]
    before = gaps[1 : args.kill_at - 1] or gaps[:1]
    after = [m for m in rows if m["step"] > args.kill_at]
    result = {
        "command": " ".join(cmd[3:]),
        "exit_code": code,
        "generators": next((int(s.split("=")[1]) for s in args.overrides if s.startswith("generator.count=")), 1),
        "groups_held_at_kill": held,
        "supervisor_noticed_s": round(restart_line - t_kill, 2) if restart_line else None,
        "engine_started_after_kill_s": round(engine["t"] - t_kill, 2) if engine else None,
        "vllm_start_s": engine.get("seconds") if engine else None,
        "worker_started_after_kill_s": round(started["t"] - t_kill, 2) if started else None,
        "first_rollout_after_kill_s": round(first_rollout - t_kill, 2) if first_rollout else None,
        "median_step_gap_before_s": round(statistics.median(before), 2) if before else None,
        "longest_step_gap_after_s": round(max(gaps[args.kill_at - 1 :]), 2) if len(gaps) >= args.kill_at else None,
        "wait_s_after_kill": round(sum(m["wait_s"] for m in after), 2),
        "max_wait_s_after_kill": round(max((m["wait_s"] for m in after), default=0), 2),
        "groups_offered_by_restart": offered,
        "shm_removed": shm_left,
        "run_dir": str(run_dir),
    }
    if result["longest_step_gap_after_s"] is not None and result["median_step_gap_before_s"] is not None:
        result["stall_s"] = round(result["longest_step_gap_after_s"] - result["median_step_gap_before_s"], 2)
    print(json.dumps(result, indent=1))
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
