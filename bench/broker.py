"""`streamrl bench broker`: the whole message path with no model, one process per role.

    streamrl bench broker                                  # 1,024-token rollouts, reward + reference + assembler
    streamrl bench broker --rollouts 2000 --consumers 2 --out /tmp/bb

A generator process publishes encoded rollouts (128-token prompt, N-token completion with
logprobs; a group's samples together, as vLLM finishes fixed-length samples in one step); the
real RewardWorker (a constant reward function), a reference process (the annotator loop of
workers/reference.py minus the model: a per-token `ref_logprobs` annotation), `--consumers` external
annotators, and the real Assembler (join, complete groups, advantages, acks) in a trainer
process with workers/trainer.py's broker traffic (background intake; per step of `--groups-per-step`
groups the step log, version and metrics line; acks at each checkpoint), which also trims the
streams below what every group consumed (streamrl/core/trimming.py, every `--trim-every-s`). Roles
connect through the embedded server's unix socket, as the roles of `streamrl up` do (`--tcp`:
loopback TCP). Three runs, side by side: a plain XADD/XREAD reader/writer pair without consumer
groups (baseline), the full path at full speed, and the full path rate-limited (latency).
Latency = the rollout's `finished_at` to its group's completion in the assembler (`batch` also
includes waiting for the batch to fill).
"""

from __future__ import annotations

import time

import numpy as np

from bench.broker_cluster import is_cluster, node_stats, per_node, totals
from bench.broker_trainer import BenchTrainer
from bench.common import (
    Servers,
    machine,
    percentiles_ms,
    print_table,
    pyplot,
    queue,
    quiet_logging,
    run_async,
    scratch_servers,
    serve_worker,
    spawn,
    stop_all,
    write_result,
)
from streamrl.annotate.annotator import Annotator
from streamrl.config.schema import (
    BrokerConfig,
    Config,
    LossConfig,
    ReferenceConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
    TrainerConfig,
)
from streamrl.core.broker import Keys
from streamrl.core.messages import Annotation, Rollout, decode, encode, new_rollout_id
from streamrl.core.worker import Worker

HELP = "message path throughput and latency (no model)"
DESCRIPTION = __doc__.split("\n\n", 1)[1]


def add_arguments(p) -> None:
    p.add_argument("--rollouts", type=int, default=16_000, help="rollouts per run (default 16000)")
    p.add_argument("--completion-tokens", type=int, default=1024)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument(
        "--groups-per-step",
        type=int,
        default=16,
        help="groups per trainer step (rollout.groups_per_step; default 16, as configs/*-gpu.yaml)",
    )
    p.add_argument("--consumers", type=int, default=0, help="external annotators besides reward + reference")
    p.add_argument(
        "--window",
        type=int,
        default=1024,
        help="rollouts published but not yet batched, at most (a job's feeder bounds this; default 1024)",
    )
    p.add_argument("--rate", type=float, default=1000.0, help="rollouts/s of the rate-limited latency run (0: skip)")
    p.add_argument("--no-baseline", action="store_true", help="skip the plain reader/writer baseline")
    p.add_argument(
        "--block-ms", type=int, default=None, help="broker.block_ms of the consumers (default: the config's)"
    )
    p.add_argument(
        "--trim-every-s",
        type=float,
        default=1.0,
        help="the trainer's trim interval (trainer.trim_every_s; a job's 10 s default outlasts a flat-out run; "
        "default 1)",
    )
    p.add_argument(
        "--tcp",
        action="store_true",
        help="connect the roles to the embedded servers over loopback TCP instead of their unix sockets",
    )
    p.add_argument(
        "--url",
        action="append",
        help="an existing redis:// server (repeat for several; default: private embedded ones)",
    )
    p.add_argument(
        "--cluster",
        action="store_true",
        help="also run on a local Redis Cluster (3 masters + 3 replicas, brokers/local_cluster.py), once per "
        "--partitions, beside one standalone server; per-node CPU per rollout and a sizing projection",
    )
    p.add_argument(
        "--partitions",
        default="1,3",
        help="rollout.partitions of the cluster runs, comma-separated (default 1,3)",
    )
    p.add_argument(
        "--wait-replicas",
        type=int,
        default=0,
        help="broker.wait_replicas of the roles (1: every durable write waits for a replica; for --cluster or a "
        "--url whose server has a replica)",
    )
    p.add_argument("--gpus", type=int, default=1000, help="job size of the sizing projection (default 1000)")
    p.add_argument(
        "--tokens-per-gpu-s",
        default="4000,20000",
        help="decode tokens/s per generation GPU of the projection, comma-separated (default 4000 (~8B policy), "
        "20000 (~1.5B))",
    )


def bench_reward(prompt: str, completion: str, meta: dict) -> float:
    """The reward function of the bench: constant, so the path, not the scoring, is measured."""
    return 1.0


def _config(url: str, run: str, args, partitions: int = 1) -> Config:
    # Roles get their broker from `Servers`; broker.url only has to be valid.
    broker = BrokerConfig(url=url) if args.block_ms is None else BrokerConfig(url=url, block_ms=args.block_ms)
    return Config(
        run=RunConfig(name=run),
        broker=broker,
        rollout=RolloutConfig(group_size=args.group_size, groups_per_step=args.groups_per_step, partitions=partitions),
        reward=RewardConfig(fn="bench.broker:bench_reward"),
        reference=ReferenceConfig(),
        loss=LossConfig(kl_beta=0.001),
        trainer=TrainerConfig(trim_every_s=args.trim_every_s),
    )  # kl_beta > 0: the assembler waits for ref_logprobs too


# -- roles -------------------------------------------------------------------------------------
def _generator(servers: Servers, keys: Keys, args, rate: float, report) -> None:
    """Publish `args.rollouts` rollouts, a whole group per XADD pipeline, at `rate` (0: flat out)."""
    quiet_logging("generator")
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 32_000, args.prompt_tokens).astype(np.int32)
    completion = rng.integers(0, 32_000, args.completion_tokens).astype(np.int32)
    logprobs = -rng.random(args.completion_tokens, dtype=np.float32)
    gs = args.group_size

    async def main() -> None:
        broker = await servers.connect()
        nbytes, t0 = 0, time.perf_counter()
        version_key, consumed, per_step = keys.trainer_version, 0, gs * args.groups_per_step
        for g in range(args.rollouts // gs):
            while g * gs - consumed >= args.window:  # backpressure, as the feeder's admission bound gives a job
                consumed = int(await broker.get(version_key) or 0) * per_step
                if g * gs - consumed >= args.window:
                    time.sleep(0.002)
            if rate:
                delay = t0 + g * gs / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)  # the loop has nothing else to do; sleep() is the precise wait
            blobs = [
                encode(
                    Rollout(
                        rollout_id=new_rollout_id(f"g{g}", s),
                        group_id=f"g{g}",
                        sample=s,
                        group_size=gs,
                        prompt_ids=prompt,
                        completion_ids=completion,
                        logprobs=logprobs,
                        version=0,
                        worker="generator-0",
                        finished_at=time.time(),
                    )
                )
                for s in range(gs)
            ]
            nbytes += sum(map(len, blobs))
            # a group to its partition (Keys.rollouts_for), no MAXLEN, as workers/generator.py: the trainer trims
            await broker.add_many(keys.rollouts_for(f"g{g}"), blobs)
        report.put(("generator", {"bytes": nbytes, "cpu_s": time.process_time()}))
        await broker.close()

    run_async(main())


class BenchReference(Annotator):
    """workers/reference.py without the model: the same annotator loop, `ref_logprobs` copied from the rollout."""

    role = "reference"
    key = "ref_logprobs"
    group = "reference"

    async def start(self) -> None:
        for stream in self.keys.rollout_streams:
            await self.broker.ensure_group(stream, self.group)

    def batch_size(self) -> int:
        return self.cfg.reference.batch_size

    async def annotate(self, rollouts: list[Rollout]) -> list[tuple]:
        return [(r.logprobs, "") for r in rollouts]


class ExternalAnnotator(Worker):
    """A bolt-on producer with its own consumer group: one scalar annotation (not required) per rollout."""

    role = "external"

    async def start(self) -> None:
        await self.broker.ensure_group(self.keys.rollouts, self.worker_id)

    async def step(self) -> bool:
        items = await self.read(self.keys.rollouts, self.worker_id, count=64, expect=Rollout)
        if not items:
            return False
        out = [
            encode(
                Annotation(
                    rollout_id=r.rollout_id,
                    key=self.worker_id,
                    value=float(len(r.completion_ids)),
                    producer=self.worker_id,
                )
            )
            for _, r in items
        ]
        await self.broker.add_many(self.keys.annotations, out)
        await self.broker.ack(self.keys.rollouts, self.worker_id, [e.id for e, _ in items])
        return True


def _role(name: str, cfg: Config, servers: Servers, report, total: int = 0) -> None:
    quiet_logging(name)
    from workers.reward import RewardWorker

    make = {
        "reward": lambda b: RewardWorker(cfg, b, "reward-0"),
        "reference": lambda b: BenchReference(cfg, b, "reference-0"),
        "trainer": lambda b: BenchTrainer(cfg, b, total, report),
    }.get(name) or (lambda b: ExternalAnnotator(cfg, b, name))
    serve_worker(make, servers)
    if name != "trainer":
        report.put((name, {"cpu_s": time.process_time()}))


# -- baseline: one writer, one plain reader ------------------------------------------------------
def _plain_reader(servers: Servers, keys: Keys, total: int, per_step: int, report) -> None:
    quiet_logging("reader")

    async def main() -> None:
        broker = await servers.connect()
        stream, last, lat, first = keys.rollouts, "0", [], float("inf")
        while len(lat) < total:
            entries = await broker.read(stream, last, count=512, block_ms=1000)
            now = time.time()
            for e in entries:
                r = decode(e.data)
                lat.append(now - r.finished_at)
                first = min(first, r.finished_at)
            if entries:
                last = entries[-1].id
                await broker.set(keys.trainer_version, len(lat) // per_step)
        report.put(
            (
                "trainer",
                {
                    "n": len(lat),
                    "first": first,
                    "last": time.time(),
                    "joined": lat,
                    "batched": lat,
                    "counters": {},
                    "cpu_s": time.process_time(),
                },
            )
        )
        await broker.close()

    run_async(main())


# -- one run ------------------------------------------------------------------------------------
def _wait_for_groups(servers: Servers, stream: str, names: set[str], timeout_s: float = 60.0) -> None:
    import redis

    from streamrl.core.broker_url import sync_client

    client = sync_client(servers.urls[0])
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            try:
                if names <= {g["name"].decode() for g in client.xinfo_groups(stream)}:
                    return
            except redis.ResponseError:
                pass  # the stream does not exist yet
            time.sleep(0.05)
    finally:
        client.close()
    raise RuntimeError(f"bench consumers did not create their groups on {stream} within {timeout_s}s")


def _server_stats(servers: Servers) -> dict:
    """The servers' CPU seconds so far, AOF rewrites so far and AOF size now; then a FLUSHALL."""
    import redis

    if is_cluster(servers.urls[0]):
        return totals(node_stats(servers.urls[0]))
    total = {"cpu_s": 0.0, "aof_rewrites": 0, "aof_mb": 0.0}
    for url in servers.urls:
        with redis.Redis.from_url(url) as c:
            info = {**c.info("cpu"), **c.info("persistence")}
            c.flushall()  # a fresh keyspace per run; the memory of the last one is freed
        # *_children: the AOF rewrites' forked children, which compete for the same cores.
        total["cpu_s"] += sum(
            float(info[k]) for k in ("used_cpu_user", "used_cpu_sys", "used_cpu_user_children", "used_cpu_sys_children")
        )
        total["aof_rewrites"] += int(info.get("aof_rewrites", 0))  # Redis >= 7; 0 where not reported
        total["aof_mb"] += int(info.get("aof_current_size", 0)) / 1e6
    return total


def run_path(servers: Servers, args, mode: str, rate: float, partitions: int = 1) -> dict:
    """One run: `plain` (baseline pair) or `full` (every role); returns its row."""
    run = f"bench-{mode}-{int(rate)}-{time.time_ns() % 10**9}"
    cfg, report = _config(servers.urls[0], run, args, partitions), queue()
    keys = Keys.of(cfg)
    server0 = _server_stats(servers)
    if mode == "plain":
        consumers = [spawn(_plain_reader, servers, keys, args.rollouts, args.group_size * args.groups_per_step, report)]
    else:
        names = ["reward", "reference", "trainer"] + [f"ext{i}" for i in range(args.consumers)]
        consumers = [spawn(_role, n, cfg, servers, report, args.rollouts) for n in names]
        for stream in keys.rollout_streams:
            _wait_for_groups(servers, stream, {"reward", "reference", "trainer"} | set(names[3:]))
    producer = spawn(_generator, servers, keys, args, rate, report)
    got: dict = {}
    try:
        while "trainer" not in got or "generator" not in got:
            name, data = report.get(timeout=600)
            got[name] = data
    finally:
        stop_all(consumers + [producer])
    while not report.empty():
        name, data = report.get()
        got[name] = data
    t = got["trainer"]
    elapsed = t["last"] - t["first"]
    cpu = {name: round(d["cpu_s"], 2) for name, d in got.items()}
    server = _server_stats(servers)
    cpu["redis-server"] = round(server["cpu_s"] - server0["cpu_s"], 2)
    row = {
        "run": "plain XADD/XREAD pair" if mode == "plain" else "full path" + (f" @ {rate:,.0f}/s" if rate else ""),
        "mode": mode,
        "target_rate": rate,
        "rollouts": t["n"],
        "seconds": round(elapsed, 3),
        "rollouts_per_s": round(t["n"] / elapsed, 1),
        "mb_per_s": round(got["generator"]["bytes"] / elapsed / 1e6, 1),
        **percentiles_ms(t["joined"]),
        "batch_p99_ms": percentiles_ms(t["batched"])["p99_ms"],
        "cpu_s": cpu,
        "assembler": t["counters"],
        "trimmed": t.get("trimmed", []),
        "trainer_steps": t.get("steps"),
        "ack_rounds": t.get("ack_rounds"),
        "aof_rewrites": server["aof_rewrites"] - server0["aof_rewrites"],
        "aof_mb_at_end": round(server["aof_mb"], 1),
        "load_avg_after": list(np.round(__import__("os").getloadavg(), 2)),
    }
    if "nodes" in server:  # a cluster: what each node spent
        row["nodes"] = per_node(server0["nodes"], server["nodes"], t["n"])
    row["_latency_ms"] = (np.asarray(t["joined"]) * 1000).tolist()
    return row


def _plot(rows: list[dict], out: str) -> None:
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.bar([r["run"] for r in rows], [r["rollouts_per_s"] for r in rows], color="tab:blue")
    a.set_ylabel("rollouts/s")
    a.tick_params(axis="x", labelrotation=15)
    for r in rows:
        lat = np.sort(r["_latency_ms"])
        b.plot(lat, np.linspace(0, 1, len(lat)), label=r["run"])
    b.set_xscale("log")
    b.set_xlabel("latency, ms (publish -> group joined)")
    b.set_ylabel("fraction of rollouts")
    b.legend()
    fig.tight_layout()
    fig.savefig(f"{out}/broker.png", dpi=100)


def run(args) -> int:
    import streamrl.assemble.assembler  # noqa: F401  imported once here, so forked roles do not each pay for it
    import workers.reward  # noqa: F401

    per_step = args.group_size * args.groups_per_step
    if args.rollouts % per_step:  # the trainer stage takes whole steps, as workers/trainer.py does
        args.rollouts += per_step - args.rollouts % per_step
        print(f"--rollouts rounded up to {args.rollouts}: whole trainer steps of {per_step} rollouts")
    info = machine()
    if args.cluster or (args.url and is_cluster(args.url[0])):
        from bench.broker_cluster_run import run_cluster

        return run_cluster(args, info, run_path)
    rows = []
    with scratch_servers(args.url, 1, "broker", local=not args.tcp) as urls:
        servers = Servers(tuple(urls), wait_replicas=args.wait_replicas)
        if not args.no_baseline:
            rows.append(run_path(servers, args, "plain", 0.0))
        rows.append(run_path(servers, args, "full", 0.0))
        if args.rate:
            rows.append(run_path(servers, args, "full", args.rate))
    print(
        f"{args.rollouts} rollouts of {args.prompt_tokens}+{args.completion_tokens} tokens (with logprobs), "
        f"group size {args.group_size}, consumers: reward + reference + assembler"
        f"{f' + {args.consumers} external' if args.consumers else ''}; {len(urls)} redis-server(s) over "
        f"{', '.join(sorted({u.split(':', 1)[0] for u in urls}))}, {info['cpus']} CPUs, "
        f"load average before {info['load_avg']}"
    )
    print_table(rows, ["run", "rollouts_per_s", "mb_per_s", "p50_ms", "p99_ms", "batch_p99_ms", "seconds"])
    for r in rows:
        print(
            f"  cpu seconds, {r['run']}: {r['cpu_s']}; trims (entries removed): {r['trimmed']}; "
            f"AOF rewrites {r['aof_rewrites']}, AOF {r['aof_mb_at_end']} MB at the end"
        )
    full = next(r for r in rows if r["mode"] == "full" and not r["target_rate"])
    limited = next((r for r in rows if r["target_rate"]), full)
    result = {
        "bench": "broker",
        "rollouts_per_s": full["rollouts_per_s"],
        "mb_per_s": full["mb_per_s"],
        "p50_ms": limited["p50_ms"],
        "p99_ms": limited["p99_ms"],
        "latency_rate": limited["target_rate"],
        "baseline_rollouts_per_s": next((r["rollouts_per_s"] for r in rows if r["mode"] == "plain"), None),
        "settings": {k: v for k, v in vars(args).items() if k not in ("func",) and not callable(v)},
        "machine": info,
        "runs": [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows],
    }
    if write_result(args.out, result):
        _plot(rows, args.out)
        print(f"wrote {args.out}/result.json and {args.out}/broker.png")
    return 0
