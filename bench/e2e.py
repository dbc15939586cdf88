"""`streamrl bench e2e`: a real job (`streamrl up`) for N steps, asynchronous and synchronous side by side.

    streamrl bench e2e                                           # tiny CPU job, 20 steps, max_staleness 1 vs 0
    streamrl bench e2e --config configs/e2e-2gpu.yaml --steps 20 --out /tmp/e2e   # two GPUs
    streamrl bench e2e --set generator.max_tokens=32 --no-sync   # only the configured job

Each job runs `streamrl up` as a subprocess (every role its own process, vLLM generators, FSDP2
trainer) into OUT/runs/<mode>; the numbers come from its metrics.jsonl and role logs through
`streamrl report`'s summary (streamrl/report/summary.py): trained tokens/s (steps after the first,
which waits for start-up), generated tokens/s, busy fraction per role, weight-sync latency
(publish -> loaded in vLLM), staleness histogram; and the async/sync speedup of trained tokens/s.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
import time
from pathlib import Path

from bench.common import machine, print_table, pyplot, write_result
from bench.jobs import Job
from streamrl.config.args import add_config_args
from streamrl.core.errors import ConfigError

HELP = "a real job for N steps, async vs max_staleness=0 (trained/generated tokens/s, busy, weight sync)"
DESCRIPTION = __doc__.split("\n\n", 1)[1]


def add_arguments(p) -> None:
    add_config_args(p)
    p.add_argument("--steps", type=int, default=20, help="trainer steps per job (default 20)")
    p.add_argument("--no-sync", action="store_true", help="skip the max_staleness=0 job")
    p.add_argument("--timeout", type=float, default=1800, help="seconds one job may take")


def run_job(args, mode: str, run_dir: Path) -> dict:
    """One `streamrl up`; returns its summary (raises with the log tail if the job fails)."""
    from streamrl.report.summary import summarize

    sets = [
        f"trainer.steps={args.steps}",
        f"run.name=e2e-{mode}",
        "run.export=false",  # a benchmark needs no Hugging Face copy of the model
        *args.overrides,
    ] + (["rollout.max_staleness=0"] if mode == "sync" else [])
    t0 = time.time()
    job = Job(run_dir, *sets, config=args.config, out=run_dir.parent / f"{mode}.out")
    try:
        code = job.wait(args.timeout)
    finally:
        job.stop(signal.SIGKILL)  # only past the timeout
    wall = time.time() - t0
    if code != 0:
        raise RuntimeError(f"the {mode} job failed (exit {code}); its output ends with:\n{job.output()[-3000:]}")
    from streamrl.config.files import load_config

    cfg = load_config(run_dir / "config.yaml")
    return {
        "mode": mode,
        "max_staleness": cfg.rollout.max_staleness,
        "wall_s": round(wall, 1),
        "first_step_s": _first_step_s(run_dir, t0),
        **summarize(run_dir),
    }


def _first_step_s(run_dir: Path, t0: float) -> float | None:
    """`streamrl up` launched -> the trainer's log line of step 1 (preflight, broker, every role's start)."""
    from datetime import datetime

    from streamrl.report.summary import log_events

    steps = [r for r in log_events(run_dir, "step") if r.get("step") == 1 and "timestamp" in r]
    if not steps:
        return None
    return round(datetime.fromisoformat(steps[0]["timestamp"].replace("Z", "+00:00")).timestamp() - t0, 1)


def _row(s: dict) -> dict:
    gen = [v for k, v in s["busy"].items() if k.startswith("generator")]
    lat = s["weight_sync_latency_s"] or {}
    return {
        "job": s["mode"],
        "max_staleness": s["max_staleness"],
        "trained_tok_s": s["trained_tokens_per_s"],
        "generated_tok_s": s["generated_tokens_per_s"],
        "steps_per_s": s["steps_per_s"],
        "trainer_busy": s["busy"].get("trainer"),
        "generator_busy": round(sum(gen) / len(gen), 3) if gen else None,
        "sync_p50_s": lat.get("p50"),
        "staleness_hist": s["staleness_hist_tokens"],
        "first_step_s": s["first_step_s"],
        "wall_s": s["wall_s"],
    }


def _plot(runs: list[dict], out: Path) -> None:
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    names = [f"{r['mode']} (s={r['max_staleness']})" for r in runs]
    a.bar(names, [r["trained_tokens_per_s"] for r in runs])
    a.set(ylabel="trained tokens/s", title="throughput")
    width = 0.8 / len(runs)
    for i, r in enumerate(runs):
        keys = [int(k) for k in r["staleness_hist_tokens"]]
        total = max(sum(r["staleness_hist_tokens"].values()), 1)
        b.bar(
            [k + i * width for k in keys],
            [v / total for v in r["staleness_hist_tokens"].values()],
            width,
            label=names[i],
        )
    b.set(xlabel="staleness", ylabel="share of trained tokens", title="staleness")
    b.legend()
    fig.tight_layout()
    fig.savefig(out / "e2e.png", dpi=100)


def run(args) -> int:
    from streamrl.report.figures import plot_run

    info = machine()
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="streamrl-e2e-"))
    runs = []
    for mode in ["async"] + ([] if args.no_sync else ["sync"]):
        run_dir = root / "runs" / mode
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        print(f"running the {mode} job ({args.steps} steps) into {run_dir} ...", flush=True)
        runs.append(run_job(args, mode, run_dir))
    rows = [_row(r) for r in runs]
    speedup = round(runs[0]["trained_tokens_per_s"] / runs[1]["trained_tokens_per_s"], 3) if len(runs) > 1 else None
    print(
        f"config {args.config or 'configs/tiny-cpu.yaml'} {' '.join(args.overrides)}; {info['cpus']} CPUs, "
        f"load average {info['load_avg']}"
    )
    print_table(rows, list(rows[0]))
    if speedup is not None:
        print(f"async/sync speedup (trained tokens/s): {speedup:.2f}x")
    result = {
        "bench": "e2e",
        "config": args.config or "configs/tiny-cpu.yaml",
        "overrides": args.overrides,
        "steps": args.steps,
        "speedup": speedup,
        "runs": runs,
        "rows": rows,
        "machine": {**info, "load_avg_after": machine()["load_avg"]},
    }
    if write_result(args.out, result):
        try:
            for r in runs:
                plot_run(root / "runs" / r["mode"], root / "plots" / r["mode"])
            _plot(runs, root)
        except ConfigError as exc:  # a GPU host without matplotlib still gets its numbers
            print(f"wrote {root}/result.json; plots skipped: {exc}")
            return 0
        print(f"wrote {root}/result.json, {root}/e2e.png and per-job plots under {root}/plots")
    return 0
