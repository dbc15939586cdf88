"""`streamrl bench peers`: streamrl's shipped GPU job and TRL's `GRPOTrainer` on the same GPU, model and
workload, side by side in one command (trained tokens/s, s/step, time to step 1, the ratio).

    pip install -e '.[peers]'        # TRL's wheels (pure Python; vLLM is the GPU machine's)
    streamrl bench peers --config configs/qwen3-0.6b-gpu.yaml --steps 10 --out /tmp/peers

The workload is the config's: its model folder, `rollout.groups_per_step x rollout.group_size`
completions of `generator.max_tokens` tokens per optimizer step (ignore_eos), `trainer.micro_batch_size`
completions per forward/backward, charclass rewards, no KL, bf16. streamrl runs its config as shipped
(asynchronous, max_staleness 1) and synchronously (max_staleness 0); TRL runs with vLLM colocated
(`vllm_mode="colocate"`) three ways: its defaults for what the workload leaves open (gradient
checkpointing on, fp32 master weights, the importance-correction forward), those settings matched to
streamrl's, and matched in its one-GPU off-policy mode (one generation feeds two optimizer steps).
Each job is its own process, one after another. Trained tokens/s counts completion tokens of the
steps after the first (which waits for start-up), as `streamrl report` does.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import machine, print_table, write_result

HELP = "streamrl's GPU job vs TRL's GRPOTrainer on the same GPU and workload (trained tokens/s, ratio)"
DESCRIPTION = __doc__.split("\n\n", 1)[1]
TRL_VARIANTS = ("default", "matched", "offpolicy")


def add_arguments(p) -> None:
    p.add_argument("--config", default="configs/qwen3-0.6b-gpu.yaml", help="the streamrl job (and the workload)")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps per job (default 10)")
    p.add_argument("--only", choices=["streamrl", "trl"], help="run one framework's jobs only")
    p.add_argument(
        "--trl-variants", default=",".join(TRL_VARIANTS), help="comma-separated subset of " + "/".join(TRL_VARIANTS)
    )
    p.add_argument("--no-sync", action="store_true", help="skip streamrl's max_staleness=0 job")
    p.add_argument("--no-vllm", action="store_true", help="TRL generates with transformers (a CPU smoke run)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds one job may take")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a streamrl config field (the workload follows it)",
    )


def workload(config: str, overrides: list[str]) -> dict:
    """What both frameworks run, read from the streamrl config (so a --set changes both)."""
    from streamrl.config.files import load_config

    cfg = load_config(config, overrides)
    if not cfg.model.path:
        raise SystemExit(f"{config}: bench peers needs model.path (both frameworks load the same folder)")
    return {
        "model": str(cfg.model.path),
        "completions": cfg.rollout.groups_per_step * cfg.rollout.group_size,
        "group": cfg.rollout.group_size,
        "max_tokens": cfg.generator.max_tokens,
        "micro_batch": cfg.trainer.micro_batch_size,
        "lr": cfg.trainer.lr,
        "gpu_memory_utilization": cfg.generator.gpu_memory_utilization,
        "max_model_len": cfg.generator.max_model_len,
    }


def trl_figures(steps: list[dict]) -> dict:
    """time to step 1, s/step and trained tokens/s from a TRL job's step clock. Steady figures span an
    even number of steps after the first, so the off-policy variant's generating and non-generating
    steps are counted alike."""
    if len(steps) < 3:
        raise RuntimeError(f"the TRL job logged {len(steps)} steps; at least 3 are needed for a steady rate")
    n = (len(steps) - 1) // 2 * 2
    span = steps[n]["t"] - steps[0]["t"]
    tokens = sum(s.get("tokens", 0) for s in steps[1 : n + 1])
    return {
        "first_step_s": round(steps[0]["t"], 1),
        "s_per_step": round(span / n, 3),
        "trained_tok_s": round(tokens / max(span, 1e-9), 1),
        "steps": len(steps),
    }


def run_trl(args, load: dict, variant: str, root: Path) -> dict:
    out = root / f"trl-{variant}.json"
    # The workload's keys are bench/peers_trl.py's flags (model -> --model, max_tokens -> --max-tokens, ...).
    flags = {**load, "variant": variant, "steps": args.steps, "out": out, "launched": time.time()}
    cmd = [sys.executable, "-m", "bench.peers_trl"]
    for key, value in flags.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    if args.no_vllm:
        cmd.append("--no-vllm")
    with open(root / f"trl-{variant}.out", "wb") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout)
    if proc.returncode != 0:
        tail = (root / f"trl-{variant}.out").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"TRL {variant} failed (exit {proc.returncode}); its output ends with:\n{tail}")
    res = json.loads(out.read_text())
    return {"job": f"trl {variant}", **trl_figures(res["steps"]), "settings": res["settings"]}


def run_streamrl(args, mode: str, root: Path) -> dict:
    from bench.e2e import run_job

    run_dir = root / "runs" / mode
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    job = argparse.Namespace(config=args.config, overrides=args.overrides, steps=args.steps, timeout=args.timeout)
    s = run_job(job, mode, run_dir)
    return {
        "job": f"streamrl {mode} (max_staleness {s['max_staleness']})",
        "first_step_s": s["first_step_s"],
        "s_per_step": round(1 / s["steps_per_s"], 3) if s["steps_per_s"] else None,
        "trained_tok_s": s["trained_tokens_per_s"],
        "steps": s["steps"],
    }


def ratios(rows: list[dict]) -> list[str]:
    """streamrl's shipped job over each TRL variant, in trained tokens/s."""
    ours = next((r for r in rows if r["job"].startswith("streamrl async")), None)
    if ours is None:
        return []
    return [
        f"streamrl (shipped) / {r['job']}: {ours['trained_tok_s'] / r['trained_tok_s']:.2f}x trained tokens/s"
        for r in rows
        if r["job"].startswith("trl") and r["trained_tok_s"]
    ]


def run(args) -> int:
    info = machine()
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="streamrl-peers-"))
    root.mkdir(parents=True, exist_ok=True)
    load = workload(args.config, args.overrides)
    print(f"workload: {json.dumps(load)}", flush=True)
    rows: list[dict] = []
    if args.only != "trl":
        for mode in ["async"] + ([] if args.no_sync else ["sync"]):
            print(f"running streamrl {mode} ({args.steps} steps) ...", flush=True)
            rows.append(run_streamrl(args, mode, root))
    if args.only != "streamrl":
        for variant in [v for v in args.trl_variants.split(",") if v]:
            if variant not in TRL_VARIANTS:
                raise SystemExit(f"--trl-variants: unknown {variant!r}; choose from {', '.join(TRL_VARIANTS)}")
            print(f"running TRL {variant} ({args.steps} steps) ...", flush=True)
            rows.append(run_trl(args, load, variant, root))
    cols = ["job", "first_step_s", "s_per_step", "trained_tok_s", "steps"]
    print_table(rows, cols)
    lines = ratios(rows)
    for line in lines:
        print(line)
    for r in rows:
        if "settings" in r:
            print(f"{r['job']} settings: {json.dumps(r['settings'])}")
    write_result(args.out, {"bench": "peers", "workload": load, "rows": rows, "ratios": lines, "machine": info})
    return 0
