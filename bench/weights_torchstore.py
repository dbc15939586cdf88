"""`weights.backend: torchstore` between two independently started processes: publish -> ready.

A publisher process (trainer rank 0's side: a real TorchStorePublisher, which starts the store and puts
its controller reference in the broker) and a reader process (a generator's side: a real
TorchStoreLoader from `make_loader`, in its own interpreter, possibly on another host or network
namespace). The reader fetches one version to warm up (its client joins the store), then the publisher
publishes the next one: ready = that publish's start (WeightHandle.created_at) -> the reader's fetch
returned (the version written locally, as vLLM's reload_weights reads it). Every tensor is checked
against the version it was published as.

    python -m bench.weights_torchstore bench --broker redis://:PW@HOST:6379/0 --bytes 1073741824

From other code (the multi-host weights bench):

    from bench.weights_torchstore import publish_to_ready
    result = publish_to_ready(url, size_bytes=1 << 30, publisher_prefix=["ip", "netns", "exec", "ns-a"],
                              reader_prefix=["ip", "netns", "exec", "ns-b"], publisher_addr=A, reader_addr=B)

The two entry points (`publish`, `read`) are also what tests/integration/weights/test_torchstore_*.py run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
TENSOR_BYTES = 64 << 20
"""Size of each tensor of the synthetic state dict (the last one takes the remainder)."""


def state_dict(version: int, size_bytes: int, tensor_bytes: int = TENSOR_BYTES) -> dict[str, torch.Tensor]:
    """`size_bytes` of float32 in tensors of `tensor_bytes`; tensor i is filled with version + i/1000, so a
    reader can tell each tensor's version (a mix of two versions would show)."""
    out, left, i = {}, size_bytes, 0
    while left > 0:
        n = min(tensor_bytes, left) // 4 or 1
        out[f"model.layers.{i}.weight"] = torch.full((n,), version + i / 1000, dtype=torch.float32)
        left -= n * 4
        i += 1
    return out


def check(sd: dict[str, torch.Tensor], version: int) -> None:
    for name, t in sd.items():
        i = int(name.split(".")[2])
        expected = torch.tensor(version + i / 1000, dtype=torch.float32)
        if not (t.min() == expected and t.max() == expected):
            raise SystemExit(f"{name} does not hold version {version} (min {t.min()}, max {t.max()})")


def _config(broker: str, run: str, addr: str, port: int, keep: int):
    from streamrl.config.schema import BrokerConfig, Config, RunConfig, WeightsConfig

    weights = WeightsConfig(backend="torchstore", keep=keep, torchstore_addr=addr, torchstore_port=port)
    return Config(run=RunConfig(name=run), broker=BrokerConfig(url=broker), weights=weights)


def _say(**fields) -> None:
    print(json.dumps(fields), flush=True)


async def _publish(args) -> None:
    """Publish version N for each line `N` on stdin (size --bytes), one JSON line per publish; EOF ends."""
    from brokers.connect import connect
    from streamrl.weights.store import make_publisher

    broker = await connect(args.broker, retries=3)
    publisher = make_publisher(_config(args.broker, args.run, args.addr, args.port, args.keep), broker, None)
    _say(event="started")
    loop = asyncio.get_running_loop()
    while line := (await loop.run_in_executor(None, sys.stdin.readline)).strip():
        version = int(line)
        sd = state_dict(version, args.bytes, args.tensor_bytes)
        t0 = time.time()
        handle = await publisher.publish(version, sd)
        _say(event="published", version=version, bytes=handle.bytes, publish_s=round(time.time() - t0, 4))
    await publisher.close()
    await broker.close()


async def _read(args) -> None:
    """Fetch the newest version, then each newer one, --versions in all; one JSON line each."""
    from brokers.connect import connect
    from streamrl.weights import torchstore_handover
    from streamrl.weights.store import make_loader

    torchstore_handover.CONNECT_TIMEOUT_S = args.connect_timeout
    if args.wait_stdin:  # started ahead (its imports take seconds), it joins the job only now
        _say(event="waiting")
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    broker = await connect(args.broker, retries=3)
    # /dev/shm where present: where a generator keeps its copies (streamrl.weights.shm.shm_root)
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(prefix="torchstore-bench-", dir=shm) as tmp:
        loader = make_loader(_config(args.broker, args.run, args.addr, 0, 2), broker, Path(args.cache or tmp))
        await _read_versions(loader, args.versions)
    await broker.close()


async def _read_versions(loader, versions: int) -> None:
    from safetensors.torch import load_file

    from streamrl.weights.files import WEIGHTS_FILE

    _say(event="started")
    last = 0
    for _ in range(versions):
        while (handle := await loader.latest()) is None or handle.version <= last:
            await loader.wait_for_publish(1.0)
        t0 = time.time()
        local = await loader.fetch(handle)
        done = time.time()
        check(load_file(str(Path(local) / WEIGHTS_FILE)), handle.version)
        last = handle.version
        _say(
            event="ready",
            version=handle.version,
            bytes=handle.bytes,
            fetch_s=round(done - t0, 4),
            ready_s=round(done - handle.created_at, 4),
        )
    await loader.close()


def argv(role: str, broker: str, run: str, addr: str, **extra) -> list[str]:
    """The command line of entry point `role` (`publish` or `read`); `extra` become --options (True: a bare
    flag). Run it with cwd=ROOT."""
    out = [sys.executable, "-m", "bench.weights_torchstore", role, "--broker", broker, "--run", run, "--addr", addr]
    for key, value in extra.items():
        flag = f"--{key.replace('_', '-')}"
        out += [flag] if value is True else [flag, str(value)]
    return out


def next_event(proc: subprocess.Popen, event: str, deadline: float) -> dict:
    """The next JSON line of `proc` (started with stdout=PIPE, text) whose event is `event`."""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{proc.args[-1]}: exited {proc.wait()} before {event!r}")
        if line.startswith("{") and (msg := json.loads(line))["event"] == event:
            return msg
    raise TimeoutError(f"no {event!r} in time")


def publish_to_ready(
    broker_url: str,
    *,
    size_bytes: int = 1 << 30,
    rounds: int = 2,
    publisher_prefix: list[str] = (),
    reader_prefix: list[str] = (),
    publisher_addr: str = "127.0.0.1",
    reader_addr: str = "127.0.0.1",
    timeout_s: float = 900,
) -> dict:
    """publish -> ready of `size_bytes` between a publisher and a reader process (each started under its
    argv prefix, e.g. `ip netns exec NS`, bound to its address); the reader warms up on one version,
    then `rounds` versions are timed. Prints one line, returns {bytes, rounds, publish_s, ready_s,
    bytes_per_s} (medians; bytes_per_s = bytes / ready_s)."""
    run = f"bench-ts-{uuid.uuid4().hex[:6]}"
    deadline = time.monotonic() + timeout_s
    pipes = dict(stdout=subprocess.PIPE, text=True, bufsize=1, cwd=ROOT)
    pub_argv = argv("publish", broker_url, run, publisher_addr, bytes=size_bytes)
    pub = subprocess.Popen([*publisher_prefix, *pub_argv], stdin=subprocess.PIPE, **pipes)
    reader = None
    try:
        next_event(pub, "started", deadline)
        pub.stdin.write("1\n")
        next_event(pub, "published", deadline)
        read_argv = argv("read", broker_url, run, reader_addr, versions=rounds + 1)
        reader = subprocess.Popen([*reader_prefix, *read_argv], **pipes)
        next_event(reader, "ready", deadline)  # the warm-up fetch of version 1
        published, ready = [], []
        for v in range(2, rounds + 2):
            pub.stdin.write(f"{v}\n")
            published.append(next_event(pub, "published", deadline))
            ready.append(next_event(reader, "ready", deadline))
    finally:
        for proc in (reader, pub):
            if proc is not None:
                if proc.stdin:
                    proc.stdin.close()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
    ready_s = statistics.median(r["ready_s"] for r in ready)
    out = {
        "bytes": ready[0]["bytes"],
        "rounds": rounds,
        "publish_s": statistics.median(p["publish_s"] for p in published),
        "ready_s": ready_s,
        "bytes_per_s": ready[0]["bytes"] / ready_s,
    }
    print(
        f"torchstore publish->ready {out['bytes'] / 2**30:.2f} GiB: {ready_s:.2f} s ({out['bytes_per_s'] / 1e9:.2f} GB/s; "
        f"publish {out['publish_s']:.2f} s), median of {rounds}",
        flush=True,
    )
    return out


def main(cli: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = p.add_subparsers(dest="role", required=True)
    bench = sub.add_parser("bench", help="publish_to_ready on this host (both processes here)")
    bench.add_argument("--broker", required=True)
    bench.add_argument("--bytes", type=int, default=1 << 30)
    bench.add_argument("--rounds", type=int, default=2)
    for role in ("publish", "read"):
        s = sub.add_parser(role)
        s.add_argument("--broker", required=True)
        s.add_argument("--run", required=True)
        s.add_argument("--addr", default="127.0.0.1", help="weights.torchstore_addr of this process")
        if role == "publish":
            s.add_argument("--port", type=int, default=0, help="weights.torchstore_port")
            s.add_argument("--bytes", type=int, default=1 << 20)
            s.add_argument("--keep", type=int, default=2)
            s.add_argument("--tensor-bytes", type=int, default=TENSOR_BYTES)
        else:
            s.add_argument("--versions", type=int, default=1)
            s.add_argument("--cache", default=None, help="where fetched versions go (default: a temp dir)")
            s.add_argument("--connect-timeout", type=float, default=30.0)
            s.add_argument("--wait-stdin", action="store_true", help="touch nothing before a line on stdin")
    args = p.parse_args(cli)
    if args.role == "publish":
        asyncio.run(_publish(args))
    elif args.role == "read":
        asyncio.run(_read(args))
    else:
        publish_to_ready(args.broker, size_bytes=args.bytes, rounds=args.rounds)


if __name__ == "__main__":
    main()
