"""The processes of the `mooncake` backend's tests (tests/integration/weights/test_mooncake*.py): a
reader and a publisher, each its own process with its own transfer engine, as generators and a
trainer are. Every state dict holds one value per version (`uniform_state`), so a mix of two versions
is seen at once.

    python tests/integration/weights/mooncake_procs.py read URL RUN MIN_VERSION [--until V] [--keep-serving S]
    python tests/integration/weights/mooncake_procs.py publish URL RUN KEEP MB V1,V2,... [--hold S]

A reader prints one JSON line per fetch ({"version", "uniform", "value", "source"} or {"error"}); a
publisher prints {"published": v} per version, then holds its slots for --hold seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from brokers.connect import connect  # noqa: E402
from streamrl.config.schema import BrokerConfig, Config, RunConfig, WeightsConfig  # noqa: E402
from streamrl.weights.files import WEIGHTS_FILE  # noqa: E402
from streamrl.weights.store import WeightStoreError, make_loader, make_publisher  # noqa: E402


def uniform_state(version: int, mb: float) -> dict[str, torch.Tensor]:
    """Two tensors (fp32 and bf16) every element of which is `version`: `mb` MB in all."""
    n = max(16, int(mb * 2**20 / 6))
    return {"a.weight": torch.full((n,), float(version)), "b.weight": torch.full((n,), float(version)).bfloat16()}


def check(path: str) -> dict:
    """Is the fetched file one version's (every element the same value)? Loads it the way vLLM would."""
    from safetensors.torch import load_file

    values = set()
    for t in load_file(str(Path(path) / WEIGHTS_FILE)).values():
        values.update((float(t.min()), float(t.max())))
    return {"uniform": len(values) == 1, "value": min(values)}


def cfg_of(url: str, run: str, keep: int = 2, peers: bool = True) -> Config:
    weights = WeightsConfig(backend="mooncake", keep=keep, engine_addr="127.0.0.1", serve_peers=peers)
    return Config(run=RunConfig(name=run), broker=BrokerConfig(url=url), weights=weights)


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def next_row(proc: subprocess.Popen, key: str) -> dict:
    """The next JSON line a process (started with stdout=PIPE, text=True) emits that holds `key`."""
    while True:
        line = proc.stdout.readline()
        assert line, f"the process ended before printing {key!r}"
        if line.startswith("{") and key in (row := json.loads(line)):
            return row


async def read(args) -> None:
    broker = await connect(args.url, retries=3)
    loader = make_loader(cfg_of(args.url, args.run, peers=not args.no_peers), broker, Path(args.run_dir))
    want, start = args.min_version, time.monotonic()
    while True:
        newest = await loader.latest()
        if newest is not None and newest.version >= want:
            emit(reading=newest.version, at=time.time())
            try:
                path = await loader.fetch(newest)
                emit(version=newest.version, source=loader.last_source, **check(path))
                want = newest.version + 1
            except WeightStoreError as exc:
                emit(error=str(exc), version=newest.version)
        if want > args.until and want > args.min_version or time.monotonic() - start > args.timeout:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(args.keep_serving)  # a peer: keep the buffer for later readers
    await loader.close()
    await broker.close()


async def publish(args) -> None:
    broker = await connect(args.url, retries=3)
    pub = make_publisher(cfg_of(args.url, args.run, keep=args.keep), broker, None)
    for v in [int(x) for x in args.versions.split(",")]:
        await pub.publish(v, uniform_state(v, args.mb))
        emit(published=v, session=pub.engine.session)
    await asyncio.sleep(args.hold)
    await broker.close()


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("read")
    r.add_argument("url")
    r.add_argument("run")
    r.add_argument("min_version", type=int)
    r.add_argument("--run-dir", default="/tmp")
    r.add_argument("--timeout", type=float, default=300.0)
    r.add_argument("--until", type=int, default=0, help="keep fetching until this version is fetched")
    r.add_argument("--keep-serving", type=float, default=0.0)
    r.add_argument("--no-peers", action="store_true")
    w = sub.add_parser("publish")
    w.add_argument("url")
    w.add_argument("run")
    w.add_argument("keep", type=int)
    w.add_argument("mb", type=float)
    w.add_argument("versions")
    w.add_argument("--hold", type=float, default=600.0)
    args = p.parse_args()
    asyncio.run(read(args) if args.cmd == "read" else publish(args))


if __name__ == "__main__":
    main()
