"""`streamrl status` against a real redis-server: what a snapshot reads and what the view shows."""

import json
import subprocess
import sys
import time

import pytest
from rich.console import Console

from streamrl.commands.status import Collector, render, sparkline, staleness_bars
from streamrl.core.messages import encode
from tests.integration.annotate.test_producers import rollout

pytestmark = pytest.mark.anyio


def test_sparkline_and_staleness_bars():
    assert sparkline([0.0, 0.5, 1.0]) == "▁▅█" and sparkline([]) == ""
    bars = staleness_bars([{"staleness_hist": {"0": 48, "1": 16}}, {"staleness_hist": {"0": 64}}])
    assert bars[0].startswith("  0 ") and bars[0].endswith("112 (88%)") and bars[1].endswith("16 (12%)")


async def fill(broker, keys):
    await broker.set(keys.trainer_version, 3)
    await broker.hset(keys.weights_latest, {"version": 3, "transport": "shm"})
    await broker.ensure_group(keys.rollouts, "trainer")
    await broker.ensure_group(keys.rollouts, "judge")
    await broker.add_many(keys.rollouts, [encode(rollout(i, 4)) for i in range(5)])
    await broker.read_group(keys.rollouts, "trainer", "trainer-0", count=2)  # 2 pending, 3 lag
    await broker.set(
        keys.worker("generator", "generator-0"),
        json.dumps({"pid": 1, "host": "h1", "ts": time.time(), "uptime_s": 10.0, "rollouts": 250}),
        ttl_s=15,
    )
    await broker.set(
        keys.worker("producer", "judge-h-7"),
        json.dumps({"pid": 7, "host": "h2", "ts": time.time(), "uptime_s": 5.0, "scored": 50}),
        ttl_s=15,
    )
    for step, reward in enumerate([0.1, 0.4, 0.8], start=1):
        await broker.add(
            keys.metrics,
            json.dumps(
                {
                    "step": step,
                    "reward_mean": reward,
                    "staleness_hist": {"0": 60, "1": 4},
                    "reward_components": {"reward": reward, "judge": 0.5},
                }
            ).encode(),
        )


async def test_snapshot_and_view(broker, run_name):
    collector = Collector(broker, run_name)
    await fill(broker, collector.keys)
    snap = await collector.snapshot()
    assert snap["trainer_version"] == 3 and snap["weights_version"] == 3
    rollouts = next(s for s in snap["streams"] if s["name"] == "rollouts")
    groups = {g["name"]: g for g in rollouts["groups"]}
    assert rollouts["length"] == 5 and groups["trainer"]["pending"] == 2 and groups["trainer"]["lag"] == 3
    assert groups["judge"]["lag"] == 5
    assert {(w["role"], w["id"]) for w in snap["workers"]} == {("generator", "generator-0"), ("producer", "judge-h-7")}
    console = Console(record=True, width=160)
    console.print(render(snap))
    text = console.export_text()
    for piece in (
        "trainer version 3",
        "weights version 3",
        "generator-0",
        "25.0 rollouts/s",
        "judge-h-7",
        "10.0 scored/s",
        "0.100 -> 0.800",
        "judge=0.500",
        "180 (94%)",
    ):
        assert piece in text, text
    assert "released: admitted groups the trainer will never train" in text  # the head's count, defined
    await broker.add(collector.keys.metrics, json.dumps({"step": 4, "reward_mean": 0.9}).encode())
    assert [m["step"] for m in (await collector.snapshot())["metrics"]] == [1, 2, 3, 4]  # incremental reads


async def test_the_view_says_when_env_steps_wait_and_no_env_worker_has_joined(broker, run_name):
    """env.fn=external: `up` starts no env worker, so status says so while none has a heartbeat."""
    collector = Collector(broker, run_name)
    keys = collector.keys
    await broker.ensure_group(keys.env_steps, "env")  # a multi-turn generator creates it
    await broker.add(keys.env_steps, b"step")

    async def view() -> str:
        console = Console(record=True, width=200)
        console.print(render(await collector.snapshot()))
        return console.export_text()

    assert "no env worker has joined: 1 env step(s) waiting" in await view()
    await broker.set(keys.worker("env", "env-node-1"), json.dumps({"ts": time.time(), "steps": 0}), ttl_s=15)
    assert "no env worker has joined" not in await view()


async def test_status_once_cli(redis_server, broker, run_name):
    collector = Collector(broker, run_name)
    await fill(broker, collector.keys)
    res = subprocess.run(
        [sys.executable, "-m", "streamrl.cli", "status", "--broker", redis_server.url, "--run", run_name, "--once"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert "generator-0" in res.stdout and "rollouts" in res.stdout and "lag" in res.stdout


def test_the_workers_table_fits_120_columns():
    """A generator's dozen counters wrap inside the table instead of widening it past 120 columns."""
    counters = {f"counter_{i}": 1000 + i for i in range(14)}
    worker = {"role": "generator", "id": "generator-0", "host": "a-long-host-name", "ts": 99.0, "uptime_s": 300.5}
    snap = {
        "run": "r",
        "now": 100.0,
        "trainer_version": 1,
        "weights_version": 1,
        "admitted": 8,
        "released": 2,
        "streams": [],
        "workers": [{**worker, "rollouts": 900, **counters}],
        "metrics": [],
    }
    console = Console(record=True, width=200)
    console.print(render(snap))
    text = console.export_text()
    table = [ln for ln in text.splitlines() if "generator" in ln or "counter_" in ln]
    assert table and max(len(ln.rstrip()) for ln in table) <= 120, "\n".join(table)
    assert "counter_13=1013" in text  # wrapped, not cut
