"""`streamrl bench env`: env step latency hidden or not. The multi-turn tiny job (real `streamrl up`:
vLLM generator, env worker, reward, FSDP trainer) at fixed env latencies, streaming vs a
synchronous turn loop, side by side.

    streamrl bench env                                  # latencies 0, 50, 500 ms; 10 steps per job
    streamrl bench env --latencies 0,500 --steps 8 --out /tmp/benv
    streamrl bench env --env-workers 2,4 --latencies 50      # replayed env steps with 2 and 4 env workers

`stream`: the configured job (configs/tiny-multiturn-cpu.yaml) with enough episodes in flight to
cover the env latency (STREAM_SETS: rollout.max_staleness=3, 40 groups in flight); episodes waiting
on the env hold no engine slot. `sync`: the classic loop: generate every episode's turn, wait for
every env step, generate the next turn (env.lockstep), one batch at a time (max_staleness 0,
generator.max_inflight_groups = rollout.groups_per_step). Both: env.concurrency=256 (steps never
queue), every env step takes exactly the given latency (env.latency_ms=[L, L]). On a CPU-only
host each role runs one compute thread (OMP_NUM_THREADS=1, vLLM bound to core 0) unless those
variables are set: on 2 cores, a multi-threaded trainer and vLLM fighting over both cores slow the
streaming job's training many times over (docs/performance.md). Columns: trained tokens/s (steps after the
first), generator busy fraction (time with at least one vLLM request running / uptime), the env
step latency the generator saw (p50), and the stream/sync ratio per latency.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from bench.common import machine, print_table, write_result
from bench.e2e import run_job
from streamrl.config.args import add_config_args

HELP = "multi-turn job: trained tokens/s and generator busy vs env latency, streaming vs synchronous turn loop"
DESCRIPTION = __doc__.split("\n\n", 1)[1]
CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "tiny-multiturn-cpu.yaml")
BOTH_SETS = ["env.concurrency=256"]
STREAM_SETS = ["rollout.max_staleness=3", "generator.max_inflight_groups=40"]


def add_arguments(p) -> None:
    add_config_args(p)
    p.add_argument("--steps", type=int, default=10, help="trainer steps per job (default 10)")
    p.add_argument("--latencies", default="0,50,500", help="env step latencies in ms (default 0,50,500)")
    p.add_argument("--timeout", type=float, default=900, help="seconds one job may take")
    p.add_argument(
        "--env-workers",
        default="",
        help="instead: streaming jobs with this many env workers each (e.g. 2,4) at the first latency, "
        "reporting replayed env steps (sticky routing keeps them near 0)",
    )


def replayed_steps(run_dir: Path) -> dict:
    """Env steps and replays (a step whose episode state the worker lacked) over every env worker's
    `stopped` line: what sticky routing (docs/protocol.md) is measured by."""
    from streamrl.report.summary import log_events

    stopped = [r for r in log_events(run_dir, "stopped") if r.get("role") == "env"]
    steps, replays = sum(r.get("steps", 0) for r in stopped), sum(r.get("replays", 0) for r in stopped)
    return {"env_steps": steps, "replays": replays, "replayed_pct": round(100 * replays / max(steps, 1), 2)}


def _job(args, mode: str, latency: float, root: Path, env_workers: int = 1) -> dict:
    from streamrl.config.files import load_config
    from streamrl.train.metrics import read_metrics

    cfg = load_config(args.config or CONFIG, list(args.overrides))
    sets = [*BOTH_SETS, f"env.latency_ms=[{latency:g},{latency:g}]"]
    if mode == "sync":
        sets += [
            "env.lockstep=true",
            "rollout.max_staleness=0",
            f"generator.max_inflight_groups={cfg.rollout.groups_per_step}",
        ]
    else:
        sets += STREAM_SETS
    if env_workers != 1:
        sets.append(f"env.count={env_workers}")
    sets += list(args.overrides)  # the user's --set wins
    job_args = argparse.Namespace(config=args.config or CONFIG, overrides=sets, steps=args.steps, timeout=args.timeout)
    name = f"{mode}-{latency:g}ms" + (f"-{env_workers}env" if env_workers != 1 else "")
    run_dir = root / "runs" / name
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    print(f"running {name} ({args.steps} steps) into {run_dir} ...", flush=True)
    s = run_job(job_args, name, run_dir)
    rows = read_metrics(run_dir)[1:] or read_metrics(run_dir)
    gen = [v for k, v in s["busy"].items() if k.startswith("generator")]
    p50 = sorted(r.get("env_step_s_p50", 0.0) for r in rows)[len(rows) // 2]
    return {
        "job": mode,
        "env_latency_ms": latency,
        "trained_tok_s": s["trained_tokens_per_s"],
        "generator_busy": round(sum(gen) / len(gen), 3) if gen else None,
        "env_step_p50_ms": round(p50 * 1000, 1),
        "turns_mean": rows[-1].get("turns_mean"),
        "env_workers": env_workers,
        **replayed_steps(run_dir),
        "steps_per_s": s["steps_per_s"],
        "wall_s": s["wall_s"],
        "summary": s,
    }


def run(args) -> int:
    if not shutil.which("nvidia-smi"):  # CPU host: one compute thread per role (see the module docstring)
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")
    info = machine()
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="streamrl-benv-"))
    latencies = [float(x) for x in args.latencies.split(",") if x.strip()]
    if args.env_workers:
        counts = [int(x) for x in args.env_workers.split(",") if x.strip()]
        rows = [_job(args, "stream", latencies[0], root, n) for n in counts]
        print_table(
            [{k: v for k, v in j.items() if k != "summary"} for j in rows], [k for k in rows[0] if k != "summary"]
        )
        result = {"bench": "env", "case": "env_workers", "steps": args.steps, "rows": rows, "machine": info}
        if write_result(args.out, result):
            print(f"wrote {root}/result.json")
        return 0
    jobs = [_job(args, mode, lat, root) for lat in latencies for mode in ("stream", "sync")]
    rows = [{k: v for k, v in j.items() if k != "summary"} for j in jobs]
    ratios = {}
    for lat in latencies:
        stream, sync = (
            next(j for j in jobs if j["job"] == m and j["env_latency_ms"] == lat) for m in ("stream", "sync")
        )
        ratios[f"{lat:g}ms"] = round(stream["trained_tok_s"] / max(sync["trained_tok_s"], 1e-9), 2)
    print(
        f"config {args.config or CONFIG} {' '.join(args.overrides)}; {args.steps} steps per job; "
        f"{info['cpus']} CPUs, load average {info['load_avg']}; OMP_NUM_THREADS="
        f"{os.environ.get('OMP_NUM_THREADS', 'unset')}"
    )
    print_table(rows, list(rows[0]))
    print("stream/sync trained tokens/s: " + ", ".join(f"{k}: {v:.2f}x" for k, v in ratios.items()))
    result = {
        "bench": "env",
        "config": args.config or CONFIG,
        "overrides": args.overrides,
        "steps": args.steps,
        "ratios": ratios,
        "rows": rows,
        "runs": [j["summary"] for j in jobs],
        "machine": {**info, "load_avg_after": machine()["load_avg"]},
    }
    if write_result(args.out, result):
        print(f"wrote {root}/result.json")
    return 0
