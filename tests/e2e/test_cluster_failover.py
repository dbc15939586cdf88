"""`streamrl up` on a local Redis Cluster (3 masters + 3 replicas) with `rollout.partitions=3`, and
failover without loss: one 40-step tiny job while a master is SIGKILLed 5 times; each time its replica
is promoted by the cluster and the killed node is started again (it rejoins as the new master's
replica, so the next kill has one to promote). The job must go on and end with the accounting exact
(lost 0, double-trained 0), with `broker.wait_replicas=1` (docs/fault-tolerance.md, "Failover"), every
partition carrying traffic on its own master. The trainer's stall per failover is printed: the step
that finished after the kill, minus the one before it, minus a typical step.

The job also waits for an external key, `judge`, scored by a producer outside the job (`streamrl reward`,
examples/python/length_judge.py) under the restricted user `streamrl producer add` made on the cluster:
it scores through every failover, every trained rollout carries its exact value (samples.jsonl), and
`streamrl status --run-dir` shows its group on every partition.

    pytest tests/e2e/test_cluster_failover.py -s
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bench.jobs import QUICK_RECOVERY, Job, assert_exact, log_events, run_cli
from brokers.local_cluster import LocalCluster
from streamrl.core.broker import Keys
from streamrl.core.broker_url import sync_client
from tests.e2e.hold import held

pytestmark = pytest.mark.slow
STEPS = 40
KILL_AT = (4, 10, 16, 22, 28)
"""Trainer steps after which a master is killed: 5 failovers, each with steps between to recover."""
ROOT = Path(__file__).resolve().parents[2]
JUDGE = "annotations.external=[{key: judge, weight: 0.5, timeout_s: 600, on_timeout: default, default: -1.0}]"
"""The external key: a group waits for it up to 600 s (a loaded host, failovers); a missing value would be -1."""


class StepClock:
    """Wall time at which each trainer step appeared in metrics.jsonl (polled every 0.05 s)."""

    def __init__(self, path: Path):
        self.path = path
        self.at: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            if self.path.exists():
                for line in self.path.read_text().splitlines():
                    if line.strip().endswith("}"):
                        self.at.setdefault(json.loads(line)["step"], time.time())
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _kill(cluster: LocalCluster, victim: int) -> float:
    """SIGKILL the master on `victim` and wait for its replica's promotion; when it was killed."""
    t = time.time()
    cluster.kill(victim)
    survivors = cluster.live_ports()
    deadline = time.monotonic() + 60
    while len(cluster.masters()) < cluster.masters_n:  # the replica is promoted after cluster-node-timeout
        assert time.monotonic() < deadline, "no replica was promoted within 60 s"
        time.sleep(0.1)
    cluster.wait_ok(60, ports=survivors)
    return t


def _trained_after(clock: StepClock, t: float, up: Job, timeout: float = 120) -> None:
    """Until a step appears after time `t`: the job went on through the failover."""
    deadline = time.monotonic() + timeout
    while not any(at > t for at in list(clock.at.values())):
        assert up.proc.poll() is None, f"up exited early ({up.proc.returncode}):\n{up.output()[-4000:]}"
        assert time.monotonic() < deadline, f"no step after the kill:\n{up.output()[-4000:]}"
        time.sleep(0.05)


def start_judge(up: Job) -> subprocess.Popen:
    """`streamrl producer add` (user, groups and partitions from the run dir's config), then the producer."""
    run_dir, deadline = up.run_dir, time.monotonic() + 400  # `up` writes config.yaml after its checks
    while not (run_dir / "config.yaml").exists():
        assert up.proc.poll() is None, f"up exited early ({up.proc.returncode}):\n{up.output()[-4000:]}"
        assert time.monotonic() < deadline, "no config.yaml"
        time.sleep(0.1)
    made = run_cli("producer", "add", "judge", "--key", "judge", "--run", "tiny", "--run-dir", str(run_dir))
    assert made.returncode == 0 and "warning" not in made.stderr, made.stderr
    url = made.stdout.splitlines()[0]
    assert url.startswith("redis+cluster://producer-tiny-judge:") and "--partitions 3" in made.stdout, made.stdout
    cmd = ["reward", "--fn", "examples.python.length_judge:judge", "--run", "tiny", "--partitions", "3"]
    cmd += ["--broker", url, "--claim-idle-ms", "3000"]
    out = open(run_dir.parent / "judge.out", "wb")
    return subprocess.Popen(
        [sys.executable, "-m", "streamrl.cli", *cmd], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
    )


def _trainer_pid(run_dir: Path) -> int:
    """The trainer's pid from its `started` line (the broker is a cluster: no plain client for its heartbeat)."""
    return next(r["pid"] for r in reversed(log_events(run_dir, "trainer-0")) if r.get("event") == "started")


@pytest.mark.timeout(900)
def test_five_master_kills_lose_nothing(tmp_path):
    with LocalCluster(tmp_path / "cluster") as cluster:
        run_dir = tmp_path / "run"
        up = Job(
            run_dir,
            *QUICK_RECOVERY,
            f"broker.url={cluster.url}",
            "rollout.partitions=3",
            "broker.wait_replicas=1",
            "broker.wait_timeout_ms=500",
            f"trainer.steps={STEPS}",
            "trainer.checkpoint_every=5",
            "metrics.samples_per_step=64",  # every rollout of a step (8 groups of 8): each one's judge value
            JUDGE,
        )
        clock = StepClock(run_dir / "metrics.jsonl")
        judge = start_judge(up)
        kills: list[float] = []
        try:
            for n, step in enumerate(KILL_AT):
                up.wait_step(step, timeout=400)
                if n == 0:  # the producer's group and lag on every partition of `rollouts`
                    shown = run_cli("status", "--run-dir", str(run_dir), "--once")
                    assert shown.returncode == 0, shown.stderr
                    lines = shown.stdout.splitlines()
                    rows = [ln for ln in lines if "judge" in ln and ("partitions)" in ln or "] tiny:p" in ln)]
                    assert len(rows) == 4, shown.stdout  # the sum over the partitions, then each partition
                victim = sorted(cluster.masters())[n % cluster.masters_n]
                kills.append(_kill(cluster, victim))
                _trained_after(clock, kills[-1], up)
                # The killed node rejoins (as the new master's replica, so the next kill has one to
                # promote) with the trainer held: that takes seconds, in which the job would otherwise
                # train past the next kills' steps (a step takes well under a second here).
                with held(_trainer_pid(run_dir)):
                    cluster.restart(victim)
                    cluster.wait_ok(60)
            assert up.wait(600) == 0, up.output()[-4000:]
            assert judge.wait(60) == 0, (run_dir.parent / "judge.out").read_text()[-4000:]  # it saw run:end
        finally:
            clock.stop()
            for proc in (up.proc, judge):
                if proc.poll() is None:
                    proc.kill()
        summary = up.summary()
        assert_exact(summary, in_flight_ok=False)
        assert summary["trained"] == STEPS * 8 and summary["dead_lettered"] == 0, summary  # 8 groups a step
        assert up.steps() == list(range(1, STEPS + 1)), "every step exactly once"
        # Every trained rollout carries the producer's value (completion tokens / 16), none the default.
        samples = [json.loads(ln) for ln in (run_dir / "samples.jsonl").read_text().splitlines() if ln.strip()]
        assert len(samples) == STEPS * 64, len(samples)
        wrong = [s for s in samples if abs(s["reward_components"]["judge"] - min(1.0, s["tokens"] / 16)) > 1e-6]
        assert not wrong, wrong[:3]
        keys = Keys("tiny", 3, cluster=True)
        with sync_client(cluster.url) as r:
            # Every partition was written and read by the trainer, each on its own master (after the kills
            # too: a promoted replica holds its master's consumer group).
            delivered = {
                s: {g["name"]: g["last-delivered-id"] for g in r.xinfo_groups(s)}[b"trainer"]
                for s in keys.rollout_streams
            }
            assert all(d not in (b"0-0", "0-0") for d in delivered.values()), delivered
            owners = {r.keyslot(s): r.nodes_manager.get_node_from_slot(r.keyslot(s)).name for s in keys.rollout_streams}
            assert len(set(owners.values())) == 3, owners

        steps = sorted(clock.at)
        gaps = [clock.at[b] - clock.at[a] for a, b in zip(steps, steps[1:])]
        typical = statistics.median(gaps)
        stalls = []
        for t in kills:
            before = max(s for s in steps if clock.at[s] <= t)
            after = min(s for s in steps if clock.at[s] > t)
            stalls.append(round(clock.at[after] - clock.at[before] - typical, 2))
        print(f"\nfailover stalls (s, over a typical step of {typical:.2f} s): {stalls}; summary: {summary}")
        (tmp_path.parent / "cluster_failover_stalls.json").write_text(
            json.dumps({"stalls_s": stalls, "typical_step_s": typical, "summary": summary})
        )
        assert len(stalls) == 5
