"""`streamrl bench broker --cluster --partitions 1,3`: one standalone server, then the local (or
given) Redis Cluster once per partition count, the per-node CPU table and the sizing projection
(bench/broker_cluster.py reads the nodes, bench/broker_sizing.py projects). Called by bench/broker.py's run,
which hands it its `run_path` (one measured run of the message path), so this module does not import it back.
"""

from __future__ import annotations

from typing import Callable

from bench.broker_cluster import is_cluster
from bench.common import Servers, print_table, scratch_servers, write_result


def run_cluster(args, info: dict, run_path: Callable[..., dict]) -> int:
    """One standalone server, then the cluster once per --partitions, each measured by `run_path`
    (bench/broker.py's); the per-node table; the projection."""
    import contextlib
    import tempfile
    from pathlib import Path

    from bench.broker_sizing import projection_lines, rollouts_needed, size_cluster
    from brokers.local_cluster import LocalCluster

    parts = [int(p) for p in args.partitions.split(",") if p.strip()]
    if args.consumers and max(parts) > 1:
        raise SystemExit("--consumers reads one stream: use it with --partitions 1 only")
    rows = []
    with scratch_servers(None, 1, "broker", local=False) as urls:  # TCP, as the cluster's roles connect
        row = run_path(Servers(tuple(urls)), args, "full", 0.0)
        rows.append({**row, "run": "standalone, 1 server"})
    with tempfile.TemporaryDirectory(prefix="streamrl-bench-cluster-") as tmp, contextlib.ExitStack() as stack:
        if args.url and is_cluster(args.url[0]):
            url = args.url[0]
        else:
            url = stack.enter_context(LocalCluster(Path(tmp))).url
        for p in parts:
            row = run_path(Servers((url,), wait_replicas=args.wait_replicas), args, "full", 0.0, partitions=p)
            rows.append({**row, "run": f"cluster 3+3, partitions={p}" + (" +WAIT" if args.wait_replicas else "")})
    print(
        f"{args.rollouts} rollouts of {args.prompt_tokens}+{args.completion_tokens} tokens, group size "
        f"{args.group_size}; {info['cpus']} CPUs, load average before {info['load_avg']}"
    )
    print_table(rows, ["run", "rollouts_per_s", "mb_per_s", "p50_ms", "p99_ms", "seconds"])
    for r in rows:
        server = r["cpu_s"]["redis-server"]
        print(f"  {r['run']}: server cpu {server} s = {server / r['rollouts'] * 1e6:.1f} us/rollout")
        for name, n in r.get("nodes", {}).items():
            print(f"    {n['role']:<7} {name}: {n['cpu_s']} s, {n['us_per_rollout']} us/rollout")
    last = [r for r in rows if "nodes" in r][-1]
    masters = sum(n["us_per_rollout"] for n in last["nodes"].values() if n["role"] == "master") / 1e6
    replicas = sum(n["us_per_rollout"] for n in last["nodes"].values() if n["role"] != "master") / 1e6
    rollout_bytes = last["mb_per_s"] * 1e6 / last["rollouts_per_s"]
    annotation_bytes = 4 * args.completion_tokens + 200  # ref_logprobs float32 + envelope; the reward's is tiny
    plans = {
        f"{args.gpus} GPUs at {tps:,} tokens/s each": size_cluster(
            rollouts_needed(args.gpus, tps, args.completion_tokens), masters, replicas, rollout_bytes, annotation_bytes
        )
        for tps in (int(t) for t in args.tokens_per_gpu_s.split(","))
    }
    print(
        f"measured ({last['run']}): masters {masters * 1e6:.1f} us, replicas {replicas * 1e6:.1f} us of CPU per "
        f"rollout; {rollout_bytes / 1e3:.1f} KB per rollout"
    )
    for line in projection_lines(plans):
        print(line)
    result = {
        "bench": "broker_cluster",
        "settings": {k: v for k, v in vars(args).items() if k not in ("func",) and not callable(v)},
        "machine": info,
        "runs": [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows],
        "projection": {k: vars(v) for k, v in plans.items()},
    }
    if write_result(args.out, result):
        print(f"wrote {args.out}/result.json")
    return 0
