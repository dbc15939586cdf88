"""Does the tiny CPU task learn with each objective, and does stale data stay safe?

    streamrl bench objectives --out /tmp/obj                       # grpo dapo gspo cispo at staleness 1
    streamrl bench objectives --objectives reinforce tis decoupled_ppo --staleness 4

Runs `streamrl up` on configs/tiny-cpu.yaml once per objective (sequentially, so the runs share
the machine the same way) and prints, per run: reward mean of the first and last 10 steps, the
gain, the lowest reward of the last 20 steps (a collapse shows here), mean staleness, and mean
|log ratio| to the behaviour policy.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np

from bench.jobs import metrics, up

HELP = "tiny-task learning curve per loss objective (and staleness)"


def add_arguments(p) -> None:
    p.add_argument("--objectives", nargs="+", default=["grpo", "dapo", "gspo", "cispo"])
    p.add_argument("--staleness", type=int, default=1, help="rollout.max_staleness for every run")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--set", dest="overrides", action="append", default=[], help="extra --set for every run")


def summarize(rows: list[dict]) -> dict:
    r = np.asarray([m["reward_mean"] for m in rows])
    return {
        "steps": len(rows),
        "first10": float(r[:10].mean()),
        "last10": float(r[-10:].mean()),
        "gain": float(r[-10:].mean() - r[:10].mean()),
        "min_last20": float(r[-20:].min()),
        "staleness_mean": float(np.mean([m["staleness_mean"] for m in rows])),
        "staleness_max": int(max(m["staleness_max"] for m in rows)),
        "abs_log_ratio": float(np.mean([m.get("abs_log_ratio_mean", float("nan")) for m in rows])),
        "time_s": float(rows[-1]["time_s"]),
    }


def run_one(name: str, args, base: Path) -> dict:
    run_dir = base / f"{name}-s{args.staleness}"
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh measurement: `up` refuses a used run dir
    t0 = time.time()
    res = up(
        run_dir,
        f"loss.name={name}",
        f"rollout.max_staleness={args.staleness}",
        f"trainer.steps={args.steps}",
        f"run.name=obj-{name}",
        "run.export=false",  # a benchmark needs no Hugging Face copy of the model
        *args.overrides,
        timeout=None,
    )
    if res.returncode != 0:
        return {"objective": name, "error": res.stderr[-2000:] or res.stdout[-2000:]}
    rows = metrics(run_dir)
    return {"objective": name, "max_staleness": args.staleness, "wall_s": time.time() - t0, **summarize(rows)}


def run(args) -> int:
    base = Path(args.out or "runs/bench-objectives").resolve()
    base.mkdir(parents=True, exist_ok=True)
    results = []
    print(
        f"{'objective':<16}{'stale':>6}{'first10':>9}{'last10':>8}{'gain':>7}{'min20':>7}{'stale':>7}{'|lr|':>7}{'wall':>7}"
    )
    for name in args.objectives:
        r = run_one(name, args, base)
        results.append(r)
        if "error" in r:
            print(f"{name:<16} FAILED: {r['error'][-300:]}")
            continue
        print(
            f"{name:<16}{args.staleness:>6}{r['first10']:>9.3f}{r['last10']:>8.3f}{r['gain']:>7.3f}"
            f"{r['min_last20']:>7.3f}{r['staleness_mean']:>7.2f}{r['abs_log_ratio']:>7.3f}{r['wall_s']:>6.0f}s",
            flush=True,
        )
    (base / "result.json").write_text(json.dumps({"runs": results}, indent=2))
    return 0 if all("error" not in r for r in results) else 1
