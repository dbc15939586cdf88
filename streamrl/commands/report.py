"""`streamrl report RUN_DIR`: a run's summary table and PNG plots, from RUN_DIR/metrics.jsonl and logs.

    streamrl report runs/tiny-20260101-120000                 # plots into RUN_DIR/report/
    streamrl report runs/demo --out /tmp/plots --json         # also print the summary as JSON

Plots: reward.png (mean +- std per step), throughput.png (trained tokens/s over a rolling window of
THROUGHPUT_WINDOW steps: one step's rate swings with what it waited for),
busy.png (trainer busy share of each step, rollouts generated while training, and each worker's
busy fraction from its shutdown log line), staleness.png (trained tokens per staleness),
losses.png (every loss metric the objective logs), eval.png (eval/pass@k, mean@n, maj@n per evaluated
version, with eval.every_steps). samples.html shows the rollouts the trainer kept of each step
(RUN_DIR/samples.jsonl, metrics.samples_per_step). `summarize()` is what `streamrl bench e2e`
reports for each job.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

NAME = "report"
HELP = "plots and a summary of a finished (or running) run from its metrics.jsonl"
LOSS_COLUMNS = 4
"""losses.png is a grid of this many panels per row (one long strip of 8 was unreadable)."""
THROUGHPUT_WINDOW = 5
"""Steps per point of throughput.png: tokens over wall time of the last this many steps."""
SUMMARY_LOSS_KEYS = ["loss", "kl", "entropy", "grad_norm"]
"""The optimisation in the summary: each one's first and last value."""
LOSS_KEYS = ["loss", "pg_loss", "kl", "entropy", "clip_frac_low", "clip_frac_high", "abs_log_ratio_mean", "grad_norm"]


def add_arguments(p) -> None:
    p.add_argument("run_dir", help="a run directory (holds metrics.jsonl)")
    p.add_argument("--out", help="where the PNGs go (default RUN_DIR/report)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON too")


def log_events(run_dir: Path, event: str) -> list[dict]:
    """Every structured log record named `event` across RUN_DIR/logs/*.jsonl."""
    out = []
    for path in sorted((Path(run_dir) / "logs").glob("*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            if f'"{event}"' in line:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a crash
                if rec.get("event") == event:
                    out.append(rec)
    return out


def step_wall(m: dict) -> float:
    """Wall time of one trainer step: waiting for the batch, training, the publish and checkpoint stalls."""
    return (
        m.get("wait_s", 0.0) + m.get("train_s", 0.0) + m.get("publish_stall_s", 0.0) + m.get("checkpoint_stall_s", 0.0)
    )


def summarize(run_dir: Path, skip: int = 1) -> dict:
    """Throughput, busy fractions, weight-sync latency and staleness of a run (steps after `skip`)."""
    from streamrl.train.metrics import read_metrics

    rows = read_metrics(run_dir)
    if not rows:
        raise FileNotFoundError(f"{run_dir}/metrics.jsonl has no steps yet; pass the directory of a run that trained")
    steady = rows[skip:] or rows  # the first step also waits for every role to start
    wall = sum(step_wall(m) for m in steady)
    hist: dict[str, int] = {}
    for m in rows:
        for k, v in (m.get("staleness_hist_tokens") or m.get("staleness_hist") or {}).items():
            hist[k] = hist.get(k, 0) + int(v)
    busy = {
        f"{r['role']}:{r['worker_id']}": r["busy_fraction"]
        for r in log_events(run_dir, "stopped")
        if "busy_fraction" in r
    }
    busy["trainer"] = round(sum(m.get("train_s", 0.0) for m in steady) / max(wall, 1e-9), 4)
    gen_tokens = sum(r.get("tokens_generated", 0) for r in log_events(run_dir, "stopped"))
    gen_start = sum(r.get("seconds", 0.0) for r in log_events(run_dir, "engine_started"))
    gen_up = sum(r.get("uptime_s", 0.0) for r in log_events(run_dir, "stopped") if r.get("role") == "generator")
    switches = [r for r in log_events(run_dir, "weights_loaded") if not r.get("joining")]
    lat = [r["switch_latency_s"] for r in switches if "switch_latency_s" in r]
    return {
        "steps": len(rows),
        "samples": int(sum(m.get("samples", 0) for m in rows)),
        "trained_tokens": int(sum(m.get("tokens", 0) for m in rows)),
        "trained_tokens_per_s": round(sum(m.get("tokens", 0) for m in steady) / max(wall, 1e-9), 2),
        "steps_per_s": round(len(steady) / max(wall, 1e-9), 4),
        "generated_tokens_per_s": round(gen_tokens / max(gen_up - gen_start, 1e-9), 2) if gen_up else None,
        "busy": busy,
        "weight_sync_latency_s": {
            "p50": round(float(np.median(lat)), 4),
            "max": round(float(np.max(lat)), 4),
            "count": len(lat),
        }
        if lat
        else None,
        "weight_sync_paused_s_mean": round(float(np.mean([r["paused_s"] for r in switches if "paused_s" in r])), 4)
        if switches
        else None,
        "staleness_hist_tokens": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))),
        "reward_first": rows[0].get("reward_mean"),
        "reward_last": rows[-1].get("reward_mean"),
        "wait_s_mean": round(float(np.mean([m.get("wait_s", 0.0) for m in steady])), 4),
        "train_s_mean": round(float(np.mean([m.get("train_s", 0.0) for m in steady])), 4),
        **{
            f"{k}_mean": round(float(np.nanmean(_column(steady, k))), 4)
            for k in STEP_RATES
            if any(k in m for m in steady)
        },
        **loss_summary(rows),
        **eval_summary(rows),
        **mismatch_summary(steady),
    }


STEP_RATES = ("mfu", "train_tflops", "gen_tokens_per_s", "gen_busy")
"""Per-step rates metrics.jsonl has where they are known (mfu: on a GPU of known peak); the summary gives their means."""


def mismatch_summary(rows: list[dict]) -> dict:
    """The generator/trainer mismatch over the steps (streamrl/train/mismatch.py): step means, and
    the largest token ratio of any step."""
    keys = sorted({k for m in rows for k in m if k.startswith("mismatch_") and "_tokens_" not in k})
    if not keys:
        return {}
    agg = {k: (np.nanmax if "_ratio_max_" in k else np.nanmean)(_column(rows, k)) for k in keys}
    return {"mismatch": {k.removeprefix("mismatch_"): round(float(v), 6) for k, v in agg.items()}}


def _column(rows: list[dict], key: str) -> np.ndarray:
    return np.asarray([m.get(key) if m.get(key) is not None else np.nan for m in rows], dtype=float)


def loss_summary(rows: list[dict]) -> dict:
    """First and last value of each of SUMMARY_LOSS_KEYS the objective logged: {"kl": "0.01 -> 0.03"}."""
    out = {}
    for key in SUMMARY_LOSS_KEYS:
        vals = [m[key] for m in rows if isinstance(m.get(key), (int, float))]
        if vals:
            out[key] = f"{vals[0]:.4g} -> {vals[-1]:.4g}"
    return out


def rolling_rate(tokens, walls, window: int = THROUGHPUT_WINDOW) -> np.ndarray:
    """Tokens per second over the last `window` steps at each step (sum over sum, not a mean of
    per-step rates, so a step that waited long weighs what it cost); pure."""
    tok = np.cumsum(np.nan_to_num(np.asarray(tokens, dtype=float)))
    wall = np.cumsum(np.asarray(walls, dtype=float))
    lo = np.maximum(np.arange(len(tok)) - window, -1)
    tok_before = np.where(lo >= 0, tok[np.maximum(lo, 0)], 0.0)
    wall_before = np.where(lo >= 0, wall[np.maximum(lo, 0)], 0.0)
    return (tok - tok_before) / np.maximum(wall - wall_before, 1e-9)


EVAL_PREFIXES = ("eval/pass@", "eval/mean@", "eval/maj@")


def eval_summary(rows: list[dict]) -> dict:
    """Evaluation during training (eval.every_steps): each eval metric per eval step, {} without eval."""
    evals = [m for m in rows if "eval/step" in m]
    if not evals:
        return {}
    keys = sorted({k for m in evals for k in m if k.startswith(EVAL_PREFIXES)})
    return {"eval": {k: {int(m["eval/step"]): round(float(m[k]), 4) for m in evals if k in m} for k in keys}}


def plot_run(run_dir: Path, out: Path) -> list[Path]:
    """Write the run's PNGs into `out`; returns their paths."""
    from streamrl.report.plotting import pyplot
    from streamrl.train.metrics import read_metrics

    plt = pyplot()
    rows = read_metrics(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    steps = [m["step"] for m in rows]
    walls = np.maximum([step_wall(m) for m in rows], 1e-9)
    written = []

    def save(fig, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=90)
        plt.close(fig)
        written.append(out / name)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    mean, std = _column(rows, "reward_mean"), np.nan_to_num(_column(rows, "reward_std"))
    ax.plot(steps, mean)
    ax.fill_between(steps, mean - std, mean + std, alpha=0.2)
    ax.set(xlabel="step", ylabel="reward (mean +- std)", title="reward")
    save(fig, "reward.png")

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, rolling_rate(_column(rows, "tokens"), walls))
    ax.set(xlabel="step", ylabel="trained tokens/s", title=f"throughput (rolling {THROUGHPUT_WINDOW} steps)")
    save(fig, "throughput.png")

    summary = summarize(run_dir)
    save(busy_figure(plt, rows, summary["busy"]), "busy.png")
    save(staleness_figure(plt, summary["staleness_hist_tokens"]), "staleness.png")
    if summary.get("eval"):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for key, by_step in summary["eval"].items():
            ax.plot(list(by_step), list(by_step.values()), marker="o", label=key.removeprefix("eval/"))
        ax.set(xlabel="policy version evaluated", ylabel="score", ylim=(-0.02, 1.02), title="evaluation")
        ax.legend(fontsize=8)
        save(fig, "eval.png")

    if (fig := losses_figure(plt, rows)) is not None:
        save(fig, "losses.png")
    return written


def busy_figure(plt, rows: list[dict], busy: dict[str, float]):
    """Per step: trainer busy share and overlap; per worker: `summarize()`'s busy fractions, one bar each."""
    steps = [m["step"] for m in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, max(3.5, 1.2 + 0.35 * len(busy))))
    a.plot(steps, _column(rows, "train_s") / np.maximum([step_wall(m) for m in rows], 1e-9), label="trainer busy")
    if "overlap_frac" in rows[0]:
        a.plot(steps, _column(rows, "overlap_frac"), label="rollouts generated while training")
    a.set(xlabel="step", ylim=(0, 1.05), title="per step")
    a.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)  # off the data
    workers = sorted(busy)  # "role:worker_id" keys; the ids already name the role
    bars = b.barh([w.split(":", 1)[-1] for w in workers], [busy[w] for w in workers])
    b.bar_label(bars, fmt="%.2f", padding=3)
    b.invert_yaxis()
    b.set(xlim=(0, 1.12), xlabel="busy fraction", title="busy fraction per worker")
    return fig


def staleness_figure(plt, hist: dict[str, int]):
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar([int(k) for k in hist], list(hist.values()))
    ax.set(xlabel="staleness (trainer version - oldest token version)", ylabel="trained tokens", title="staleness")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # whole versions and whole tokens
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    return fig


def losses_figure(plt, rows: list[dict]):
    """One panel per loss metric the objective logged, LOSS_COLUMNS per row; None if it logged none."""
    from matplotlib.ticker import MaxNLocator

    keys = [k for k in LOSS_KEYS if any(isinstance(m.get(k), (int, float)) for m in rows)]
    if not keys:
        return None
    steps = [m["step"] for m in rows]
    ncols = min(LOSS_COLUMNS, len(keys))
    nrows = -(-len(keys) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 2.8 * nrows), squeeze=False)
    for ax, k in zip(axes.flat, keys):
        ax.plot(steps, _column(rows, k))
        ax.set(xlabel="step", title=k)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in list(axes.flat)[len(keys) :]:
        ax.set_visible(False)
    return fig


def run(args) -> int:
    from streamrl.core.errors import ConfigError
    from streamrl.report.samples_html import write_samples_html
    from streamrl.train.samples import FILE as SAMPLES_FILE
    from streamrl.train.samples import read_samples

    run_dir = Path(args.run_dir)
    if not (run_dir / "metrics.jsonl").is_file():
        raise ConfigError(
            f"{run_dir} has no metrics.jsonl; pass a run directory (runs/<name>-<time>) "
            "of a `streamrl up` that has trained at least one step"
        )
    summary = summarize(run_dir)
    out = Path(args.out) if args.out else run_dir / "report"
    written = plot_run(run_dir, out)
    if (run_dir / SAMPLES_FILE).is_file():
        written.append(write_samples_html(read_samples(run_dir), out / "samples.html", f"samples of {run_dir.name}"))
    for key, value in summary.items():
        print(f"{key:>26}  {value}")
    print(f"wrote {', '.join(p.name for p in written)} to {out}")
    if args.json:
        print(json.dumps(summary))
    return 0
