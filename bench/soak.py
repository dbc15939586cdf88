"""Soak: run the tiny job for a long stretch and report resident-memory growth per role and the
broker's memory, to show stream trimming keeps the broker bounded and no role leaks.

    streamrl bench soak --minutes 20 --out /tmp/soak          (python -m bench.soak --minutes 20)

Starts `streamrl up` (configs/tiny-cpu.yaml, a step count it cannot reach), samples every
--every-s seconds the RSS of each role's whole process group (a generator's vLLM engine core
included) and the broker's INFO memory + stream lengths, stops the job with SIGINT (graceful),
and prints first/last/growth per role after a warm-up. Growth is reported per hour of run time.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import redis

from bench import jobs
from bench.common import print_table, write_result
from bench.jobs import Job
from streamrl.core.broker import Keys

HELP = "run the tiny job for a long stretch; report RSS growth per role and broker memory"


def add_arguments(p) -> None:
    p.add_argument("--minutes", type=float, default=20.0, help="how long the job runs")
    p.add_argument("--every-s", type=float, default=15.0, help="sampling period")
    p.add_argument(
        "--warmup-s", type=float, default=120.0, help="samples before this (after the first step) are ignored"
    )
    p.add_argument("--set", dest="overrides", action="append", default=[], help="config override (repeatable)")


def _group_rss_mb(pgid: int) -> float:
    """RSS of every process in process group `pgid` (a role and the processes it started)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            for line in Path(f"/proc/{entry}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1024


def _sample(r: redis.Redis, run: str) -> dict:
    keys = Keys(run)
    roles = {}
    for key in r.scan_iter(match=keys.workers_prefix + "*"):
        info = json.loads(r.get(key) or "{}")
        if "pid" in info:
            roles[key.decode().rsplit(":", 1)[1]] = _group_rss_mb(
                os.getpgid(info["pid"]) if _alive(info["pid"]) else -1
            )
    mem = r.info("memory")
    streams = {s: r.xlen(getattr(keys, s)) for s in ("prompts", "rollouts", "annotations", "deadletter", "metrics")}
    step = int(r.get(keys.trainer_version) or 0)
    return {
        "t": time.time(),
        "step": step,
        "rss_mb": roles,
        "broker_used_mb": mem["used_memory"] / 2**20,
        "broker_rss_mb": mem["used_memory_rss"] / 2**20,
        "streams": streams,
    }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def run(args) -> int:
    run_dir = Path(tempfile.mkdtemp(prefix="soak-"))
    name = f"soak{int(time.time())}"
    job = Job(
        run_dir,
        f"run.name={name}",
        "trainer.steps=1000000",
        "trainer.checkpoint_every=50",
        *args.overrides,
        config="tiny-cpu.yaml",
        out=run_dir / "up.out",
    )
    proc = job.proc
    samples, t_end, t_first = [], time.time() + args.minutes * 60, None
    try:
        while time.time() < t_end and proc.poll() is None:
            time.sleep(args.every_s)
            url_file = run_dir / "broker" / "url"
            if not url_file.exists():
                continue
            with redis.Redis.from_url(url_file.read_text().strip()) as r:
                s = _sample(r, name)
            if s["step"] > 0:
                t_first = t_first or s["t"]
                samples.append(s)
                print(
                    f"t={s['t'] - t_first:7.0f}s step {s['step']:5d} broker {s['broker_used_mb']:.1f} MB "
                    f"rollouts {s['streams']['rollouts']} "
                    + " ".join(f"{k} {v:.0f}" for k, v in sorted(s["rss_mb"].items())),
                    flush=True,
                )
    finally:
        job.stop(signal.SIGINT, timeout=300)
        code = proc.returncode
    kept = [s for s in samples if t_first and s["t"] - t_first >= args.warmup_s]
    if len(kept) < 2:
        print(f"not enough samples after the warm-up (exit code {code}); see {run_dir / 'up.out'}")
        return 1
    first, last = kept[0], kept[-1]
    hours = (last["t"] - first["t"]) / 3600
    rows = []
    for role in sorted(set(first["rss_mb"]) & set(last["rss_mb"])):
        a, b = first["rss_mb"][role], last["rss_mb"][role]
        rows.append(
            {
                "role": role,
                "rss_first_mb": round(a, 1),
                "rss_last_mb": round(b, 1),
                "growth_mb": round(b - a, 1),
                "growth_mb_per_h": round((b - a) / hours, 1),
            }
        )
    for key in ("broker_used_mb", "broker_rss_mb"):
        rows.append(
            {
                "role": key,
                "rss_first_mb": round(first[key], 1),
                "rss_last_mb": round(last[key], 1),
                "growth_mb": round(last[key] - first[key], 1),
                "growth_mb_per_h": round((last[key] - first[key]) / hours, 1),
            }
        )
    print_table(
        rows,
        ["role", "rss_first_mb", "rss_last_mb", "growth_mb", "growth_mb_per_h"],
        title=f"soak: {last['step'] - first['step']} steps over {hours * 60:.1f} min after warm-up "
        f"(steps {first['step']}..{last['step']}); stream lengths at the end: {last['streams']}",
    )
    summary = jobs.summary(run_dir) if (run_dir / "summary.json").exists() else {}
    print(
        f"accounting: {json.dumps({k: summary.get(k) for k in ('admitted', 'trained', 'in_flight', 'lost', 'double_trained')})}"
    )
    write_result(args.out, {"rows": rows, "samples": samples, "summary": summary, "exit_code": code})
    return 0 if summary.get("invariant_holds") else 1


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=HELP)
    parser.add_argument("--out")
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
