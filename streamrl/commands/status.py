"""`streamrl status`: a live terminal view of a run, read from its broker.

    streamrl status --run-dir runs/demo              # live, refreshed every --interval seconds
    streamrl status --broker redis://... --run tiny --once     # one snapshot (scripts, tests)

Shows the trainer's step and published weights version, each stream's length with every consumer
group's pending and lag (XINFO GROUPS; a partitioned stream, rollout.partitions > 1, as the sum over
its partitions with a row per partition below), each worker's heartbeat (age, host, counters, throughput
= its main counter / uptime), the staleness histogram of recent steps and the reward trend (from
the `metrics` stream the trainer appends to). For a run whose `streamrl up` has ended, it prints
that and the run's RUN_DIR/summary.json instead.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import deque
from pathlib import Path

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from streamrl.commands.common import add_broker_arg
from streamrl.core.broker import Keys, partition_tag

NAME = "status"
HELP = "live view of a run: trainer, streams, consumer lag, workers, staleness, reward"
DESCRIPTION = "A live terminal view of a run read from its broker (--once prints one snapshot)."
STREAMS = ["prompts", "rollouts", "annotations", "env_steps", "deadletter", "metrics", "control"]
PARTITIONED = {"rollouts": "rollout_streams", "annotations": "annotation_streams"}
"""Streams split into rollout.partitions partitions, and the Keys attribute listing them."""
MAIN_COUNTER = {
    "generator": "rollouts",
    "reward": "scored",
    "reference": "scored",
    "judge": "scored",
    "producer": "scored",
    "feeder": "admitted",
    "env": "steps",
}
"""The counter whose rate is a role's throughput."""
RECENT = 20
"""Steps the staleness histogram and the reward trend cover."""
BARS = "▁▂▃▄▅▆▇█"
COUNTERS_WIDTH = 38
"""The workers table's counters column wraps at this width, so the table fits 120 columns."""
LEGEND = (
    "released: admitted groups the trainer will never train (dropped stale, filtered by dynamic "
    "sampling, failed), whose admission slot the feeder refills; age: seconds since the last heartbeat"
)


def add_arguments(p) -> None:
    p.add_argument("--run-dir", help="run directory of a `streamrl up` (broker URL and run name from it)")
    add_broker_arg(p)
    p.add_argument("--run", help="run name (default: run.name in RUN_DIR/config.yaml, else tiny)")
    p.add_argument(
        "--partitions",
        type=int,
        help="the job's rollout.partitions (default: RUN_DIR/config.yaml's, else found from the broker's keys)",
    )
    p.add_argument("--once", action="store_true", help="print one snapshot and exit")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")


class Collector:
    """Reads a snapshot of the run from the broker; keeps the metrics it has seen between refreshes."""

    def __init__(self, broker, run: str, partitions: int = 1):
        self.broker, self.keys = broker, Keys(run, partitions, cluster=getattr(broker, "cluster", False))
        self.metrics: deque[dict] = deque(maxlen=200)
        self._metrics_cursor = "0"

    async def _int(self, key: str) -> int | None:
        raw = await self.broker.get(key)
        return None if raw is None else int(raw)

    async def snapshot(self) -> dict:
        k = self.keys
        streams = []
        for name in STREAMS:
            if name in PARTITIONED and k.partitions > 1:
                streams.append(await self._partitioned(name, getattr(k, PARTITIONED[name])))
                continue
            key = getattr(k, name)
            streams.append(
                {"name": name, "length": await self.broker.stream_len(key), "groups": await self.broker.group_info(key)}
            )
        workers = []
        for key in sorted(await self.broker.scan(k.workers_prefix + "*")):
            raw = await self.broker.get(key)
            if raw is None:
                continue  # expired between SCAN and GET: the worker left
            role, _, wid = key[len(k.workers_prefix) :].partition(":")
            try:
                info = json.loads(raw)
            except ValueError:
                info = {}
            workers.append({"role": role, "id": wid, **(info if isinstance(info, dict) else {})})
        while batch := await self.broker.read(k.metrics, self._metrics_cursor, count=1000):
            self._metrics_cursor = batch[-1].id
            for entry in batch:
                try:
                    self.metrics.append(json.loads(entry.data))
                except (TypeError, ValueError):
                    pass  # not a metrics line; status shows what it can
        weights = await self.broker.hgetall(k.weights_latest)
        return {
            "run": k.run,
            "now": time.time(),
            "trainer_version": await self._int(k.trainer_version),
            "weights_version": int(weights["version"]) if "version" in weights else None,
            "admitted": await self._int(k.feeder_admitted),
            "released": await self._int(k.trainer_released),
            "streams": streams,
            "workers": workers,
            "metrics": list(self.metrics),
        }

    async def _partitioned(self, name: str, keys: list[str]) -> dict:
        """One stream split into partitions: the sums over them, and each partition under `partitions`."""
        parts = [
            {
                "name": f"  [{i}] {partition_tag(self.keys.run, i, len(keys))}",
                "length": await self.broker.stream_len(key),
                "groups": await self.broker.group_info(key),
            }
            for i, key in enumerate(keys)
        ]
        groups: dict[str, dict] = {}
        for part in parts:
            for g in part["groups"]:
                total = groups.setdefault(g["name"], {"name": g["name"], "consumers": 0, "pending": 0, "lag": 0})
                total["consumers"] = max(total["consumers"], g["consumers"])  # one consumer reads every partition
                total["pending"] += g["pending"]
                total["lag"] = None if total["lag"] is None or g["lag"] is None else total["lag"] + g["lag"]
        return {
            "name": f"{name} ({len(keys)} partitions)",
            "length": sum(p["length"] for p in parts),
            "groups": list(groups.values()),
            "partitions": parts,
        }


def sparkline(values: list[float]) -> str:
    if not values:
        return ""
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    return "".join(BARS[min(len(BARS) - 1, int((v - lo) / span * len(BARS)))] for v in values)


def staleness_bars(rows: list[dict], width: int = 30) -> list[str]:
    """Samples per staleness over `rows` (their staleness_hist), one bar per staleness value."""
    hist: dict[int, int] = {}
    for r in rows:
        for s, n in (r.get("staleness_hist") or {}).items():
            hist[int(s)] = hist.get(int(s), 0) + int(n)
    total = sum(hist.values()) or 1
    return [
        f"{s:>3} {'█' * max(1, round(width * n / total))} {n} ({100 * n / total:.0f}%)" for s, n in sorted(hist.items())
    ]


def env_warning(snap: dict) -> str:
    """A warning while a multi-turn job's generators send env steps (they create the `env` group on
    env_steps) and no env worker has a heartbeat: with env.fn=external nothing else starts one."""
    steps = next((s for s in snap["streams"] if s["name"] == "env_steps"), None)
    group = next((g for g in (steps or {}).get("groups") or [] if g["name"] == "env"), None)
    if group is None or any(w["role"] == "env" for w in snap["workers"]):
        return ""
    waiting = (group["pending"] or 0) + (group["lag"] or 0)
    return (
        f"no env worker has joined: {waiting} env step(s) waiting. Start one "
        "(streamrl env --fn package.module:Class --run RUN --broker URL, docs/environments.md)"
    )


def render(snap: dict) -> Group:
    rows = snap["metrics"][-RECENT:]
    last = rows[-1] if rows else {}
    head = Text(
        f"run {snap['run']} | trainer step {last.get('step', '-')} | trainer version "
        f"{snap['trainer_version'] if snap['trainer_version'] is not None else '-'} | weights version "
        f"{snap['weights_version'] if snap['weights_version'] is not None else '-'} | groups admitted "
        f"{snap['admitted'] or 0}, released {snap['released'] or 0}",
        style="bold",
    )

    streams = Table(title="streams", expand=False)
    for col in ("stream", "length", "group", "consumers", "pending", "lag"):
        streams.add_column(col, justify="left" if col in ("stream", "group") else "right")
    for s in (row for stream in snap["streams"] for row in [stream, *stream.get("partitions", [])]):
        groups = s["groups"] or [{"name": "-", "consumers": "", "pending": "", "lag": ""}]
        for i, g in enumerate(groups):
            lag = "?" if g["lag"] is None else g["lag"]
            streams.add_row(
                s["name"] if i == 0 else "",
                str(s["length"]) if i == 0 else "",
                g["name"],
                str(g["consumers"]),
                str(g["pending"]),
                str(lag),
            )

    workers = Table(title="workers (heartbeats)", expand=False)
    for col in ("role", "id", "host", "age s", "up s", "throughput"):
        workers.add_column(col, justify="right" if col.endswith(" s") else "left")
    workers.add_column("counters", max_width=COUNTERS_WIDTH, overflow="fold")
    for w in snap["workers"]:
        main = MAIN_COUNTER.get(w["role"])
        uptime = w.get("uptime_s")
        rate = f"{w[main] / uptime:.1f} {main}/s" if main in w and uptime else "-"
        age = f"{snap['now'] - w['ts']:.1f}" if isinstance(w.get("ts"), (int, float)) else "-"
        counters = ", ".join(
            f"{k}={v:g}"
            for k, v in w.items()
            if k not in ("role", "id", "host", "pid", "ts", "uptime_s") and isinstance(v, (int, float))
        )
        up = f"{uptime:.0f}" if isinstance(uptime, (int, float)) else "-"
        workers.add_row(w["role"], w["id"], str(w.get("host", "-")), age, up, rate, counters)

    parts = [head, streams, workers, Text(LEGEND, style="dim")]
    if warning := env_warning(snap):
        parts.insert(1, Text(warning, style="bold red"))
    if rows:
        trend = [r.get("reward_mean", 0.0) for r in rows]
        comps = last.get("reward_components") or {}
        parts.append(
            Text(
                f"reward (last {len(rows)} steps) {sparkline(trend)}  {trend[0]:.3f} -> {trend[-1]:.3f}"
                + ("  components: " + ", ".join(f"{k}={v:.3f}" for k, v in comps.items()) if comps else "")
            )
        )
        parts.append(
            Text(f"staleness of trained samples (last {len(rows)} steps):\n" + "\n".join(staleness_bars(rows)))
        )
    else:
        parts.append(Text("no trainer steps yet (the metrics stream is empty)"))
    return Group(*parts)


def _run_name(args) -> str:
    if args.run:
        return args.run
    if args.run_dir:
        import yaml

        path = Path(args.run_dir) / "config.yaml"
        if path.is_file():
            return yaml.safe_load(path.read_text())["run"]["name"]
    return "tiny"


async def _partitions(args, broker, run: str) -> int:
    """--partitions, else the run dir's rollout.partitions, else as many as the broker holds `rollouts` of."""
    from streamrl.commands.common import run_dir_config
    from streamrl.core.broker import found_partitions

    if args.partitions:
        return args.partitions
    cfg = run_dir_config(args.run_dir) if args.run_dir else None
    if cfg is not None:
        return cfg.rollout.partitions
    return max(1, len(await found_partitions(broker, run)))


async def _main(args) -> int:
    from brokers.connect import connect
    from streamrl.commands.common import broker_url
    from streamrl.launch.rundir import describe_finished, finished_summary

    if args.run_dir and (summary := finished_summary(Path(args.run_dir))) is not None:
        print(describe_finished(Path(args.run_dir), summary))  # its broker is gone with its `up`
        return 0
    broker = await connect(broker_url(args), retries=3)
    run = _run_name(args)
    collector = Collector(broker, run, await _partitions(args, broker, run))
    console = Console(width=None if sys.stdout.isatty() else 120)  # pipes: no 80-column wrapping
    try:
        if args.once:
            console.print(render(await collector.snapshot()))
            return 0
        from rich.live import Live

        with Live(render(await collector.snapshot()), console=console, refresh_per_second=4) as live:
            while True:
                await asyncio.sleep(args.interval)
                live.update(render(await collector.snapshot()))
    finally:
        await broker.close()


def run(args) -> int:
    try:
        return asyncio.run(_main(args))
    except KeyboardInterrupt:
        return 0
