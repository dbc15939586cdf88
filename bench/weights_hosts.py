"""`streamrl bench weights_hosts`: weights across two hosts, side by side: publish -> ready and bytes/s
of the `mooncake`, `dir` and `torchstore` backends, and publish -> all N ready for N readers with and
without peers (mooncake's fan-out: the N readers start each version together; with peers each holder
serves one of them at a time and later ones read from those done, counted and printed). Root only: the hosts are two network namespaces joined by a veth
pair (the trainer's with the broker; the readers' with nothing but the veth), on one machine.

    sudo streamrl bench weights_hosts --sizes 1.073741824,3.4 --out /tmp/wh        # ~10 min on 2 cores
    sudo streamrl bench weights_hosts --sizes 0.25 --readers 1,2,4 --repeats 2     # the fan-out table

What is timed: from the moment the trainer's publish starts (WeightHandle.created_at) to the moment a
reader has the version readable in its host's memory (what vLLM's reload takes; the reload itself is
not included). Both namespaces share one kernel and clock, so the veth's speed is the machine's memory
and CPU, not a NIC's: the figures rank the backends' own costs; the network's are in docs/multihost.md's
sizing table. `dir`'s folder is this machine's disk (page cache): its best case (an NFS adds the network).
"""

from __future__ import annotations

import json
import os
import queue
import random
import secrets
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.common import write_result
from streamrl.config.schema import BrokerConfig, Config, RunConfig, WeightsConfig
from streamrl.weights.shm import shm_root

HELP = "weights across two network namespaces: mooncake vs dir vs torchstore; fan-out with peers (root)"
REPO = Path(__file__).resolve().parents[1]


def add_arguments(p) -> None:
    p.add_argument("--sizes", default="1.073741824,3.4", help="state dict sizes in GB (1 GiB, Qwen3-1.7B bf16)")
    p.add_argument("--backends", default="mooncake,dir,torchstore")
    p.add_argument("--readers", default="1,2,4", help="fan-out: numbers of readers (mooncake, with and without peers)")
    p.add_argument("--fanout-gb", type=float, default=0.25, help="state dict size of the fan-out runs")
    p.add_argument("--repeats", type=int, default=3, help="versions published per measurement (median reported)")


class Hosts:
    """Two namespaces, `trainer` (10.x.y.1, with the broker) and `gen` (10.x.y.2), one veth between them."""

    def __init__(self):
        self.tag = secrets.token_hex(3)
        routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
        prefix = next(
            p
            for p in (f"10.{random.randint(64, 250)}.{random.randint(0, 255)}." for _ in range(100))
            if p not in routes
        )
        self.addr = {"trainer": prefix + "1", "gen": prefix + "2"}
        self.ns = {h: f"srlb-{self.tag}-{h}" for h in self.addr}
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> "Hosts":
        a, b = f"wb{self.tag}a", f"wb{self.tag}b"
        steps = [["netns", "add", self.ns["trainer"]], ["netns", "add", self.ns["gen"]]]
        steps += [
            ["link", "add", a, "netns", self.ns["trainer"], "type", "veth", "peer", "name", b, "netns", self.ns["gen"]]
        ]
        for host, dev in (("trainer", a), ("gen", b)):
            steps += [["-n", self.ns[host], "addr", "add", self.addr[host] + "/24", "dev", dev]]
            steps += [["-n", self.ns[host], "link", "set", dev, "up"], ["-n", self.ns[host], "link", "set", "lo", "up"]]
        for step in steps:
            subprocess.run(["ip", *step], check=True, capture_output=True)
        return self

    def popen(self, host: str, argv: list[str], **kw) -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns[host], *argv], env=env, cwd=REPO, **kw)
        self.procs.append(proc)
        return proc

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for ns in self.ns.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


class Role:
    """A role process whose JSON lines arrive on a queue (read by a thread: its stdout never blocks it)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.lines = proc, queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.put(json.loads(line))
        self.lines.put({"error": f"exited with code {self.proc.wait()}"})

    def next(self, key: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            row = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            if key in row or "exited with code" in row.get("error", ""):
                return row


def mem_available_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1e6
    return float("inf")


PEAK_COPIES = 4
"""Host copies of a version at the peak of one measurement: the publisher's state and slot, a reader's
receive buffer and its /dev/shm file (all in one machine's memory here)."""


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def measure(
    hosts: Hosts, work: Path, url: str, backend: str, gb: float, readers: int, peers: bool, repeats: int
) -> dict:
    """Publish `repeats` versions of `gb` GB; per version, publish -> every reader ready."""
    run = f"wh-{backend}-{secrets.token_hex(2)}"
    weights = WeightsConfig(backend=backend, keep=1, dir=str(work / run / "shared"), serve_peers=peers)
    cfg = Config(run=RunConfig(name=run), broker=BrokerConfig(url=url), weights=weights)
    folder = work / run
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(cfg.model_dump_json())
    py = [sys.executable, "-m", "bench.weights_hosts_roles"]
    log = work / f"{run}.log"  # kept when the bench fails
    pipe = dict(stdout=subprocess.PIPE, stderr=open(log, "ab"), text=True)
    pub = Role(
        hosts.popen("trainer", [*py, "publish", str(folder / "config.json"), str(gb)], stdin=subprocess.PIPE, **pipe)
    )
    rds = [Role(hosts.popen("gen", [*py, "read", str(folder / "config.json")], **pipe)) for _ in range(readers)]
    out = {
        "backend": backend,
        "gb": gb,
        "readers": readers,
        "peers": peers,
        "publish_s": [],
        "ready_s": [],
        "sources": [],
    }
    try:
        for role in [pub, *rds]:
            row = role.next("ready", 600)
            if "error" in row:
                raise RuntimeError(f"{backend}: a role did not start ({row['error']}; {log})")
        for v in range(1, repeats + 1):
            pub.proc.stdin.write(f"{v}\n")
            pub.proc.stdin.flush()
            done = pub.next("publish_s", 900)
            if "error" in done:
                raise RuntimeError(f"{backend}: publish failed ({done['error']}; {log})")
            ready = []
            for r in rds:
                while (row := r.next("ready_at", 900)).get("version", v) < v:
                    pass
                if "error" in row:
                    raise RuntimeError(f"{backend}: a reader failed ({row['error']}; {log})")
                ready.append(row["ready_at"])
                out["sources"].append(row["source"])
            out["publish_s"].append(done["publish_s"])
            out["ready_s"].append(max(ready) - done["created_at"])
    finally:
        for role in [pub, *rds]:
            role.proc.kill()
            role.proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(shm_root(run, folder), ignore_errors=True)  # the killed readers' copies
    ready = _median(out["ready_s"])
    out |= {"publish_med_s": _median(out["publish_s"]), "ready_med_s": ready, "gbps": gb * readers / ready}
    return out


def measure_torchstore(hosts: Hosts, url: str, gb: float, repeats: int) -> dict:
    """torchstore between the two namespaces: bench/weights_torchstore.py's publisher in the trainer's and its
    reader in the generator's, each Monarch listener on its namespace's address (issue 41, item 4)."""
    from bench.weights_torchstore import publish_to_ready

    r = publish_to_ready(
        url,
        size_bytes=int(gb * 1e9),
        rounds=repeats,
        publisher_prefix=["ip", "netns", "exec", hosts.ns["trainer"]],
        reader_prefix=["ip", "netns", "exec", hosts.ns["gen"]],
        publisher_addr=hosts.addr["trainer"],
        reader_addr=hosts.addr["gen"],
    )
    return {
        "backend": "torchstore",
        "gb": gb,
        "readers": 1,
        "peers": False,
        "publish_s": [r["publish_s"]],
        "ready_s": [r["ready_s"]],
        "sources": ["trainer"],
        "publish_med_s": r["publish_s"],
        "ready_med_s": r["ready_s"],
        "gbps": gb / r["ready_s"],
    }


def run(args) -> int:
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("redis-server"):
        print("bench weights_hosts needs root, iproute2 (`ip netns`) and redis-server")
        return 2
    sizes = [float(s) for s in args.sizes.split(",") if s]
    backends = [b for b in args.backends.split(",") if b]
    results, notes = [], {}
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"streamrl-wh-{os.getpid()}"
    with Hosts() as hosts:
        port = 6400 + random.randint(0, 500)
        password = secrets.token_hex(8)
        redis = hosts.popen(
            "trainer",
            [
                "redis-server",
                "--bind",
                hosts.addr["trainer"],
                "--port",
                str(port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--requirepass",
                password,
            ],
            stdout=subprocess.DEVNULL,
        )
        url = f"redis://:{password}@{hosts.addr['trainer']}:{port}/0"
        time.sleep(1.0)
        for backend in backends:
            for gb in sizes:
                if (free := mem_available_gb()) < PEAK_COPIES * gb + 2:
                    notes[f"{backend} {gb} GB"] = (
                        f"skipped: needs ~{PEAK_COPIES * gb + 2:.0f} GB of memory, {free:.1f} available"
                    )
                    print(f"{backend} {gb} GB: {notes[f'{backend} {gb} GB']}", flush=True)
                    continue
                if backend == "torchstore":
                    row = measure_torchstore(hosts, url, gb, args.repeats)
                else:
                    row = measure(hosts, work, url, backend, gb, 1, True, args.repeats)
                results.append(row)
                print(
                    f"{backend:>10} {gb:6.2f} GB  publish {row['publish_med_s']:7.2f} s  publish->ready "
                    f"{row['ready_med_s']:7.2f} s  {row['gbps']:6.2f} GB/s",
                    flush=True,
                )
        fanout = []
        if "mooncake" in backends:
            for n in [int(x) for x in args.readers.split(",") if x]:
                for peers in (False, True):
                    row = measure(hosts, work, url, "mooncake", args.fanout_gb, n, peers, args.repeats)
                    fanout.append(row)
                    from_peer = sum(s != "trainer" for s in row["sources"])
                    print(
                        f"fan-out N={n} peers={'on ' if peers else 'off'} {args.fanout_gb} GB: publish->all ready "
                        f"{row['ready_med_s']:6.2f} s  ({from_peer}/{len(row['sources'])} reads from a peer)",
                        flush=True,
                    )
        redis.kill()
    shutil.rmtree(work, ignore_errors=True)
    print_table(results, notes)
    print_fanout(fanout)
    write_result(args.out, {"transfer": results, "fanout": fanout, "notes": notes})
    return 0


def print_table(results: list[dict], notes: dict) -> None:
    sizes = sorted({r["gb"] for r in results})
    print("\npublish -> ready (median), one reader in another namespace; GB/s = size / that time")
    print(f"{'backend':>10} " + " ".join(f"{f'{gb:.2f} GB':>22}" for gb in sizes))
    for backend in dict.fromkeys(r["backend"] for r in results):
        cells = []
        for gb in sizes:
            row = next((r for r in results if r["backend"] == backend and r["gb"] == gb), None)
            cells.append(f"{row['ready_med_s']:8.2f} s {row['gbps']:6.2f} GB/s" if row else f"{'-':>22}")
        print(f"{backend:>10} " + " ".join(f"{c:>22}" for c in cells))
    for backend, why in notes.items():
        print(f"{backend:>10} {why}")


def print_fanout(fanout: list[dict]) -> None:
    """publish -> all N ready per N, peers off and on side by side, and where the reads went."""
    if not fanout:
        return
    print("\nfan-out (mooncake): publish -> all N ready (median); reads served by a peer / all reads")
    print(f"{'N':>3} {'peers off':>10} {'peers on':>10} {'from a peer':>12}")
    for n in dict.fromkeys(r["readers"] for r in fanout):
        off = next((r for r in fanout if r["readers"] == n and not r["peers"]), None)
        on = next((r for r in fanout if r["readers"] == n and r["peers"]), None)
        cells = [f"{r['ready_med_s']:8.2f} s" if r else f"{'-':>10}" for r in (off, on)]
        served = f"{sum(s != 'trainer' for s in on['sources'])}/{len(on['sources'])}" if on else "-"
        print(f"{n:>3} {cells[0]:>10} {cells[1]:>10} {served:>12}")
