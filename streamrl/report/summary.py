"""A run's summary, from RUN_DIR/metrics.jsonl and the roles' logs (RUN_DIR/logs/*.jsonl).

    summarize(run_dir)        # throughput, busy fractions, weight-sync latency, staleness, losses, eval
    log_events(run_dir, "weights_loaded")

What `streamrl report` prints and `streamrl bench e2e` reports for each job; streamrl/report/figures.py
draws the same numbers.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SUMMARY_LOSS_KEYS = ["loss", "kl", "entropy", "grad_norm"]
"""The optimisation in the summary: each one's first and last value."""


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
            f"{k}_mean": round(float(np.nanmean(column(steady, k))), 4)
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
    agg = {k: (np.nanmax if "_ratio_max_" in k else np.nanmean)(column(rows, k)) for k in keys}
    return {"mismatch": {k.removeprefix("mismatch_"): round(float(v), 6) for k, v in agg.items()}}


def column(rows: list[dict], key: str) -> np.ndarray:
    """One metric over the rows, NaN where a row lacks it."""
    return np.asarray([m.get(key) if m.get(key) is not None else np.nan for m in rows], dtype=float)


def loss_summary(rows: list[dict]) -> dict:
    """First and last value of each of SUMMARY_LOSS_KEYS the objective logged: {"kl": "0.01 -> 0.03"}."""
    out = {}
    for key in SUMMARY_LOSS_KEYS:
        vals = [m[key] for m in rows if isinstance(m.get(key), (int, float))]
        if vals:
            out[key] = f"{vals[0]:.4g} -> {vals[-1]:.4g}"
    return out


EVAL_PREFIXES = ("eval/pass@", "eval/mean@", "eval/maj@")


def eval_summary(rows: list[dict]) -> dict:
    """Evaluation during training (eval.every_steps): each eval metric per eval step, {} without eval."""
    evals = [m for m in rows if "eval/step" in m]
    if not evals:
        return {}
    keys = sorted({k for m in evals for k in m if k.startswith(EVAL_PREFIXES)})
    return {"eval": {k: {int(m["eval/step"]): round(float(m[k]), 4) for m in evals if k in m} for k in keys}}
