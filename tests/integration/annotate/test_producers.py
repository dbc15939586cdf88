"""External producers against a real redis-server: the Python SDK (batches, concurrency limit, sync
and async functions, errors, dead letters, takeover of a dead replica's entries), `streamrl producer
add|list|remove`, and the Node.js example producer under its user. What that user may and may not do,
on Redis 6.2 and >= 7: tests/integration/brokers/test_producer_acl.py."""

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from brokers.connect import connect
from streamrl.annotate.sdk import ProducerWorker, producer, spec_of
from streamrl.config.schema import BrokerConfig
from streamrl.core import run_end
from streamrl.core.broker import Keys
from streamrl.core.errors import BrokerError
from streamrl.core.messages import Annotation, Rollout, decode, encode
from tests.nodejs import start_node_producer

pytestmark = pytest.mark.anyio


def rollout(i: int, length: int) -> Rollout:
    return Rollout(
        rollout_id=f"g{i // 4}:{i % 4}",
        group_id=f"g{i // 4}",
        sample=i % 4,
        group_size=4,
        prompt_ids=np.array([1, 2]),
        completion_ids=np.arange(length),
        logprobs=np.zeros(length),
        version=0,
        text="x" * length,
    )


async def publish(broker, keys, n: int, garbage: bool = True) -> None:
    await broker.add_many(keys.rollouts, [encode(rollout(i, 1 + i % 16)) for i in range(n)])
    if garbage:
        await broker.add(keys.rollouts, b"\x93not a streamrl message")


async def annotations(broker, keys, want: int, timeout: float = 20.0) -> list[Annotation]:
    deadline = time.time() + timeout
    while await broker.stream_len(keys.annotations) < want:
        assert time.time() < deadline, f"only {await broker.stream_len(keys.annotations)} of {want} annotations"
        await asyncio.sleep(0.05)
    return [decode(e.data) for e in await broker.read(keys.annotations, count=10_000)]


async def run_until(worker, broker, keys, want):
    task = asyncio.create_task(worker.run())
    try:
        return await annotations(broker, keys, want)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)


async def test_sdk_async_batches_under_the_concurrency_limit(broker, run_name):
    keys, active, sizes = Keys(run_name), {"now": 0, "max": 0}, []

    @producer(key="judge", batch_size=4, concurrency=2)
    async def judge(rollouts):
        sizes.append(len(rollouts))
        active["now"] += 1
        active["max"] = max(active["max"], active["now"])
        await asyncio.sleep(0.1)
        active["now"] -= 1
        return [len(r.completion_ids) / 16 for r in rollouts]

    await publish(broker, keys, 20)
    worker = ProducerWorker(
        judge, spec_of(judge), broker, run_name, "judge-0", BrokerConfig(claim_idle_ms=200, block_ms=50)
    )
    got = await run_until(worker, broker, keys, 20)
    assert sorted(a.rollout_id for a in got) == sorted(rollout(i, 1).rollout_id for i in range(20))
    assert all(a.key == "judge" and a.producer == "judge-0" and not a.error for a in got)
    assert {a.rollout_id: a.value for a in got}["g1:2"] == pytest.approx((1 + 6) / 16)
    assert active["max"] == 2 and max(sizes) <= 4 and sum(sizes) == 20
    dead = await broker.read(keys.deadletter)
    assert len(dead) == 1 and b"not valid msgpack" in dead[0].data
    info = {g["name"]: g for g in await broker.group_info(keys.rollouts)}
    assert info["judge"]["pending"] == 0 and info["judge"]["lag"] == 0


async def test_sdk_sync_function_failures_become_error_annotations(broker, run_name):
    keys = Keys(run_name)

    def flaky(rollouts):  # a plain function runs in a thread
        if any(r.group_id == "g1" for r in rollouts):
            raise RuntimeError("judge backend returned 503")
        return [float("nan") if r.sample == 3 else [0.5, 0.5] if r.sample == 2 else 1.0 for r in rollouts]

    await publish(broker, keys, 8, garbage=False)
    worker = ProducerWorker(
        flaky,
        spec_of(flaky, key="judge", batch_size=4),
        broker,
        run_name,
        "j-0",
        BrokerConfig(claim_idle_ms=200, block_ms=50),
    )
    got = {a.rollout_id: a for a in await run_until(worker, broker, keys, 8)}
    assert got["g0:0"].value == 1.0 and not got["g0:0"].error
    assert "returned nan" in got["g0:3"].error
    assert "returned 2 values for one rollout" in got["g0:2"].error and got["g0:2"].value == 0.0
    assert all("RuntimeError: judge backend returned 503" in got[f"g1:{i}"].error for i in range(4))
    assert len(await broker.read(keys.deadletter)) == 6
    assert worker.stats["errors"] == 6 and worker.stats["scored"] == 8


async def test_a_dead_replicas_pending_rollouts_are_taken_over(broker, run_name):
    keys = Keys(run_name)
    await broker.ensure_group(keys.rollouts, "judge")
    await publish(broker, keys, 6, garbage=False)
    taken = await broker.read_group(keys.rollouts, "judge", "judge-crashed", count=6)  # read, never acked
    assert len(taken) == 6
    worker = ProducerWorker(
        lambda rs: [0.5] * len(rs),
        spec_of(lambda rs: [], key="judge"),
        broker,
        run_name,
        "judge-1",
        BrokerConfig(claim_idle_ms=200, block_ms=50),
    )
    got = await run_until(worker, broker, keys, 6)
    assert {a.producer for a in got} == {"judge-1"}
    info = {g["name"]: g for g in await broker.group_info(keys.rollouts)}
    assert info["judge"]["pending"] == 0


def producer_add(url: str, run: str, name: str) -> str:
    res = subprocess.run(
        [sys.executable, "-m", "streamrl.cli", "producer", "add", name, "--key", name, "--run", run, "--broker", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert "streamrl reward --fn" in res.stdout
    return res.stdout.splitlines()[0]


async def test_node_producer_under_its_acl_user(redis_server, broker, run_name, tmp_path):
    keys = Keys(run_name)
    url = producer_add(redis_server.url, run_name, "judge")
    await publish(broker, keys, 12)
    proc = start_node_producer(url, run_name, "judge", tmp_path / "node.log", "--claim-idle-ms", "500")
    try:
        got = await annotations(broker, keys, 12, timeout=60)
        by_id = {a.rollout_id: a for a in got}
        for i in range(12):
            r = rollout(i, 1 + i % 16)
            assert by_id[r.rollout_id].value == pytest.approx(len(r.completion_ids) / 16)
        assert all(a.key == "judge" and a.producer.startswith("judge-") and not a.error for a in got)
        deadline = time.time() + 20
        while not (dead := await broker.read(keys.deadletter)) and time.time() < deadline:
            await asyncio.sleep(0.1)
        assert len(dead) == 1
        record = json.loads(dead[0].data.split(b"\n", 1)[0])
        assert record["stream"] == keys.rollouts and record["reason"]
        deadline = time.time() + 20
        while (await broker.group_info(keys.rollouts))[0]["pending"] and time.time() < deadline:
            await asyncio.sleep(0.1)
        assert (await broker.group_info(keys.rollouts))[0]["pending"] == 0
        await run_end.mark_ended(broker, keys, "trainer finished", version=5)
        code = await asyncio.to_thread(proc.wait, 20)  # it leaves by itself when the run ends
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
    log = (tmp_path / "node.log").read_text()
    assert code == 0, log
    assert '"event":"stopped"' in log and '"scored":12' in log and "ended: trainer finished" in log


async def test_producer_list_and_remove(redis_server, broker, run_name):
    url = producer_add(redis_server.url, run_name, "judge")
    keys = Keys(run_name)

    def cli(*args):
        res = subprocess.run(
            [sys.executable, "-m", "streamrl.cli", "producer", *args, "--run", run_name, "--broker", redis_server.url],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0, res.stderr
        return res.stdout

    assert cli("list").split() == [f"producer-{run_name}-judge"]
    assert "removed 1 user" in cli("remove", "judge", "--drop-group")
    assert cli("list").strip() == ""
    assert "judge" not in {g["name"] for g in await broker.group_info(keys.rollouts)}
    with pytest.raises(BrokerError, match="rejected the credentials"):
        await connect(url, retries=0)


def reward_cli(fn: str, run: str, url: str, producer_id: str, *extra: str, cwd: Path) -> subprocess.Popen:
    """`streamrl reward --fn FN` as a user runs it (in `cwd`, where FN's module is), console on stdout."""
    argv = ["-m", "streamrl.cli", "reward", "--fn", fn, "--run", run, "--broker", url, "--id", producer_id, *extra]
    return subprocess.Popen(
        [sys.executable, *argv], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


async def test_reward_cli_serves_a_decorated_function(redis_server, broker, run_name, tmp_path):
    keys = Keys(run_name)
    await publish(broker, keys, 8)
    proc = reward_cli(
        "length_judge:judge",
        run_name,
        redis_server.url,
        "judge-cli",
        "--run-dir",
        str(tmp_path),
        cwd=Path(__file__).resolve().parents[3] / "examples" / "python",
    )
    try:
        got = await annotations(broker, keys, 8, timeout=60)
        assert {a.producer for a in got} == {"judge-cli"} and all(a.key == "judge" for a in got)
        assert {a.rollout_id: a.value for a in got}["g1:3"] == pytest.approx(8 / 16)
        assert "uptime_s" in json.loads(await broker.get(keys.worker("producer", "judge-cli")))  # heartbeat
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert (tmp_path / "logs" / "judge-cli.jsonl").exists()
    assert await broker.get(keys.worker("producer", "judge-cli")) is None  # a clean exit removes the heartbeat


async def test_a_hung_sync_call_times_out_and_does_not_hold_up_the_exit(redis_server, broker, run_name, tmp_path):
    """A sync function that hangs past timeout_s fails its batch at the deadline, and SIGTERM still
    ends the producer promptly: the hung call's thread is retired, not waited for at exit."""
    (tmp_path / "hung_judge.py").write_text(
        "import time\nfrom streamrl.annotate.sdk import producer\n\n"
        "@producer(key='judge', batch_size=8, timeout_s=0.5)\n"
        "def judge(rollouts):\n    time.sleep(120)\n    return [0.0] * len(rollouts)\n"
    )
    keys = Keys(run_name)
    await publish(broker, keys, 4, garbage=False)
    proc = reward_cli("hung_judge:judge", run_name, redis_server.url, "judge-hung", cwd=tmp_path)
    try:
        got = await annotations(broker, keys, 4, timeout=60)
        assert all(a.error == "timed out after 0.5s" for a in got), [a.error for a in got]
    finally:
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            pytest.fail(f"the producer did not exit within 30 s of SIGTERM (a hung call held it):\n{out[-2000:]}")
    assert proc.returncode == 0, out
    assert time.monotonic() - t0 < 15, out


async def test_sdk_reads_every_partition_and_writes_each_annotation_to_its_rollouts(broker, run_name):
    keys = Keys(run_name, partitions=3)

    @producer(key="judge", batch_size=4, concurrency=2)
    def judge(rollouts):
        return [1.0] * len(rollouts)

    by_stream: dict[str, set[str]] = {}
    for i in range(24):
        r = rollout(i, 2)
        await broker.add(keys.rollouts_for(r.group_id), encode(r))
        by_stream.setdefault(keys.annotations_for(r.group_id), set()).add(r.rollout_id)
    assert len(by_stream) == 3  # the six groups fill every partition
    worker = ProducerWorker(judge, spec_of(judge), broker, run_name, "j-0", BrokerConfig(block_ms=50), partitions=3)
    task = asyncio.create_task(worker.run())
    try:
        deadline = time.time() + 20
        while sum([await broker.stream_len(s) for s in keys.annotation_streams]) < 24:
            assert time.time() < deadline
            await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)
    for stream, rids in by_stream.items():
        assert {decode(e.data).rollout_id for e in await broker.read(stream, count=100)} == rids
    for stream in keys.rollout_streams:
        assert {g["name"]: g["pending"] for g in await broker.group_info(stream)}["judge"] == 0
