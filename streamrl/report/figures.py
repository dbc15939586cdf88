"""A run's PNG plots, from RUN_DIR/metrics.jsonl and the summary (streamrl/report/summary.py).

    plot_run(run_dir, out)    # -> [out/reward.png, out/throughput.png, ...]

reward.png (mean +- std per step), throughput.png (trained tokens/s over a rolling window of
THROUGHPUT_WINDOW steps: one step's rate swings with what it waited for), busy.png (trainer busy
share of each step, rollouts generated while training, and each worker's busy fraction from its
shutdown log line), staleness.png (trained tokens per staleness), losses.png (every loss metric the
objective logs), eval.png (eval/pass@k, mean@n, maj@n per evaluated version, with eval.every_steps).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from streamrl.report.summary import column, step_wall, summarize

LOSS_COLUMNS = 4
"""losses.png is a grid of this many panels per row (one long strip of 8 was unreadable)."""
THROUGHPUT_WINDOW = 5
"""Steps per point of throughput.png: tokens over wall time of the last this many steps."""
LOSS_KEYS = ["loss", "pg_loss", "kl", "entropy", "clip_frac_low", "clip_frac_high", "abs_log_ratio_mean", "grad_norm"]


def rolling_rate(tokens, walls, window: int = THROUGHPUT_WINDOW) -> np.ndarray:
    """Tokens per second over the last `window` steps at each step (sum over sum, not a mean of
    per-step rates, so a step that waited long weighs what it cost); pure."""
    tok = np.cumsum(np.nan_to_num(np.asarray(tokens, dtype=float)))
    wall = np.cumsum(np.asarray(walls, dtype=float))
    lo = np.maximum(np.arange(len(tok)) - window, -1)
    tok_before = np.where(lo >= 0, tok[np.maximum(lo, 0)], 0.0)
    wall_before = np.where(lo >= 0, wall[np.maximum(lo, 0)], 0.0)
    return (tok - tok_before) / np.maximum(wall - wall_before, 1e-9)


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
    mean, std = column(rows, "reward_mean"), np.nan_to_num(column(rows, "reward_std"))
    ax.plot(steps, mean)
    ax.fill_between(steps, mean - std, mean + std, alpha=0.2)
    ax.set(xlabel="step", ylabel="reward (mean +- std)", title="reward")
    save(fig, "reward.png")

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, rolling_rate(column(rows, "tokens"), walls))
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
    a.plot(steps, column(rows, "train_s") / np.maximum([step_wall(m) for m in rows], 1e-9), label="trainer busy")
    if "overlap_frac" in rows[0]:
        a.plot(steps, column(rows, "overlap_frac"), label="rollouts generated while training")
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
        ax.plot(steps, column(rows, k))
        ax.set(xlabel="step", title=k)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in list(axes.flat)[len(keys) :]:
        ax.set_visible(False)
    return fig
