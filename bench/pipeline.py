"""`streamrl bench pipeline`: the real engine with simulated stages, swept over max_staleness.

    streamrl bench pipeline                               # balanced stages, staleness 0 1 2 4 8
    streamrl bench pipeline --train-s 0.25 --staleness 0 2 --out /tmp/bp

Each run is a small job: the real feeder (admission rule), reward worker, broker and Assembler
(join + staleness filter), with bench/sim_workers.py standing in for vLLM and FSDP (the
generator decodes `--tokens` steps of `--token-ms` for a wave of generator.max_inflight_groups
groups; the trainer takes `--train-s` per step). Reports throughput (trained rollouts/s after
`--warmup` steps), the trainer's mean wait for a batch (wait_s), the ideal min(generation rate,
training rate), generator and trainer busy fractions, and async vs sync speedup against the
theoretical (1/g + 1/t) / max(1/g, 1/t).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import (
    Servers,
    machine,
    print_table,
    pyplot,
    quiet_logging,
    scratch_servers,
    serve_worker,
    spawn,
    stop_all,
    write_result,
)
from streamrl.config.schema import Config

HELP = "throughput vs max_staleness with simulated generator/trainer (no GPU)"
DESCRIPTION = __doc__.split("\n\n", 1)[1]


def add_arguments(p) -> None:
    p.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2, 4, 8], help="max_staleness values")
    p.add_argument("--steps", type=int, default=14, help="trainer steps per run")
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the throughput (pipeline filling)")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--groups-per-step", type=int, default=2)
    p.add_argument("--tokens", type=int, default=64, help="completion tokens per rollout")
    p.add_argument("--token-ms", type=float, default=8.0, help="time of one decoding step of the whole wave")
    p.add_argument("--train-s", type=float, default=0.512, help="time of one trainer step")
    p.add_argument("--url", action="append", help="an existing redis:// server (default: a private embedded one)")


def rates(args) -> dict:
    """Generation and training rates (rollouts/s) of the configured stages, and the ideal throughput."""
    wave = args.groups_per_step * args.group_size  # generator.max_inflight_groups = groups_per_step
    g = wave / (args.tokens * args.token_ms / 1000)
    t = args.groups_per_step * args.group_size / args.train_s
    return {
        "gen_rate": g,
        "train_rate": t,
        "ideal": min(g, t),
        "sync_ideal": 1 / (1 / g + 1 / t),
        "speedup_theory": (1 / g + 1 / t) / max(1 / g, 1 / t),
    }


def _config(url: str, run: str, model_path: str, args, staleness: int) -> Config:
    from streamrl.config.files import load_config

    return load_config(
        None,
        [
            f"run.name={run}",
            f"broker.url={url}",
            f"model.path={model_path}",
            f"rollout.group_size={args.group_size}",
            f"rollout.groups_per_step={args.groups_per_step}",
            f"rollout.max_staleness={staleness}",
            f"generator.max_inflight_groups={args.groups_per_step}",
            # The feeder admits for staleness + 1 steps past the trainer's last, so the generator stays
            # in its steady state to the end instead of draining (SimTrainer stops at args.steps).
            f"generator.max_tokens={args.tokens}",
            "generator.weights_poll_s=0.01",
            f"trainer.steps={args.steps + staleness + 1}",
            "loss.kl_beta=0",
            "reward.fn=bench.broker:bench_reward",
            f"task.charclass_length={args.tokens}",
        ],
    )


def _role(name: str, cfg: Config, servers: Servers, run_dir: str, args) -> None:
    quiet_logging(name)
    from bench.sim_workers import SimGenerator, SimTrainer
    from workers.feeder import FeederWorker
    from workers.reward import RewardWorker

    def make(broker):
        return {
            "feeder": lambda: FeederWorker(cfg, broker, "feeder-0"),
            "reward": lambda: RewardWorker(cfg, broker, "reward-0"),
            "generator": lambda: SimGenerator(
                cfg, broker, "generator-0", args.token_ms / 1000, args.tokens, Path(run_dir)
            ),
            "trainer": lambda: SimTrainer(cfg, broker, "trainer-0", Path(run_dir), args.train_s, args.steps),
        }[name]()

    serve_worker(make, servers)


def run_one(servers: Servers, model_path: str, args, staleness: int, run_dir: Path) -> dict:
    from bench.sim_workers import busy_fraction

    run = f"pipe-s{staleness}-{time.time_ns() % 10**9}"
    cfg = _config(servers.urls[0], run, model_path, args, staleness)
    procs = {n: spawn(_role, n, cfg, servers, str(run_dir), args) for n in ("trainer", "reward", "generator", "feeder")}
    deadline = time.monotonic() + 120 + args.steps * (args.train_s + args.tokens * args.token_ms / 1000) * 3
    try:
        while procs["trainer"].is_alive() and time.monotonic() < deadline:
            if any(not p.is_alive() for n, p in procs.items() if n != "trainer"):
                raise RuntimeError(f"a role process died during the staleness={staleness} run")
            procs["trainer"].join(0.2)
        if procs["trainer"].is_alive():
            raise RuntimeError(f"the staleness={staleness} run did not finish {args.steps} steps in time")
        time.sleep(0.2)  # the generator's busy file catches up with the trainer's last step
    finally:
        stop_all(list(procs.values()))
    busy = {n: json.loads((run_dir / f"busy-{n}.json").read_text()) for n in ("generator", "trainer")}
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    t0, t1 = rows[args.warmup - 1]["ts"] if args.warmup else rows[0]["ts"] - rows[0]["train_s"], rows[-1]["ts"]
    counted = rows[args.warmup :]
    hist: dict[str, int] = {}
    for r in rows:
        for k, v in r["staleness_hist"].items():
            hist[k] = hist.get(k, 0) + v
    r = rates(args)
    throughput = sum(x["samples"] for x in counted) / (t1 - t0)
    return {
        "max_staleness": staleness,
        "throughput": round(throughput, 3),
        "ideal": round(r["ideal"], 3),
        "ratio": round(throughput / r["ideal"], 3),
        "gen_busy": round(busy_fraction(busy.get("generator", []), t0, t1), 3),
        "train_busy": round(busy_fraction(busy.get("trainer", []), t0, t1), 3),
        "staleness_hist": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))),
        "dropped_stale": rows[-1].get("dropped_stale", 0),
        "steps": len(rows),
        "seconds": round(t1 - t0, 3),
        "wait_s": round(float(np.mean([x["wait_s"] for x in counted])), 4),
    }


def _plot(rows: list[dict], r: dict, out: str) -> None:
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    xs = [row["max_staleness"] for row in rows]
    a.plot(xs, [row["throughput"] for row in rows], "o-", label="measured")
    a.axhline(r["ideal"], color="tab:green", ls="--", label="ideal min(g, t)")
    a.axhline(r["sync_ideal"], color="tab:red", ls=":", label="synchronous theory")
    a.set_xlabel("max_staleness")
    a.set_ylabel("trained rollouts/s")
    a.set_ylim(bottom=0)
    a.legend()
    b.plot(xs, [row["gen_busy"] for row in rows], "o-", label="generator busy")
    b.plot(xs, [row["train_busy"] for row in rows], "s-", label="trainer busy")
    b.set_xlabel("max_staleness")
    b.set_ylim(0, 1.05)
    b.legend()
    fig.tight_layout()
    fig.savefig(f"{out}/pipeline.png", dpi=100)


def run(args) -> int:
    from argparse import Namespace

    import streamrl.assemble.assembler  # noqa: F401  imported once, before forking the role processes
    import workers.feeder  # noqa: F401
    import workers.reward  # noqa: F401
    from streamrl.models.tiny import resolve_model

    if args.warmup >= args.steps:
        from streamrl.core.errors import ConfigError

        raise ConfigError(f"--warmup {args.warmup} leaves no measured steps of --steps {args.steps}; lower --warmup")
    info = machine()
    model_path = resolve_model(Config()).model.path  # the feeder tokenizes prompts with the tiny tokenizer
    rows = []
    with scratch_servers(args.url, 1, "pipeline") as urls, tempfile.TemporaryDirectory(prefix="streamrl-pipe-") as tmp:
        for s in args.staleness:
            run_dir = Path(tmp) / f"s{s}"
            run_dir.mkdir()
            rows.append(run_one(Servers(tuple(urls)), model_path, args, s, run_dir))
    r = rates(args)
    sync = next((row for row in rows if row["max_staleness"] == 0), None)
    for row in rows:
        row["speedup"] = round(row["throughput"] / sync["throughput"], 3) if sync else None
    print(
        f"generation {r['gen_rate']:.2f} rollouts/s, training {r['train_rate']:.2f} rollouts/s, ideal "
        f"{r['ideal']:.2f}; theoretical async/sync speedup {r['speedup_theory']:.3f}; {info['cpus']} CPUs, "
        f"load average {info['load_avg']}"
    )
    print_table(
        rows,
        [
            "max_staleness",
            "throughput",
            "ideal",
            "ratio",
            "gen_busy",
            "train_busy",
            "speedup",
            "wait_s",
            "dropped_stale",
            "staleness_hist",
        ],
    )
    result = {
        "bench": "pipeline",
        "rows": rows,
        **{k: round(v, 4) for k, v in r.items()},
        "settings": {k: v for k, v in vars(args).items() if not isinstance(v, Namespace) and not callable(v)},
        "machine": {**info, "load_avg_after": machine()["load_avg"]},
    }
    if write_result(args.out, result):
        _plot(rows, r, args.out)
        print(f"wrote {args.out}/result.json and {args.out}/pipeline.png")
    return 0
