"""The two processes of `streamrl bench weights_hosts` (bench/weights_hosts.py), each started in its own
network namespace: a publisher (the trainer's side of a weights backend) and a reader (a generator's).

    python -m bench.weights_hosts_roles publish CONFIG_JSON GB     # stdin: one version per line
    python -m bench.weights_hosts_roles read CONFIG_JSON           # fetches every newer version

Both print one JSON line per version: the publisher {"version", "created_at", "publish_s"}, a reader
{"version", "ready_at", "source"} once the version is readable in its host's memory (what a generator
hands vLLM's reload; the reload itself is not timed here). A failure prints {"error"}.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import torch

from brokers.connect import connect
from streamrl.config.schema import Config
from streamrl.weights.store import WeightStoreError, make_loader, make_publisher

CHUNK = 64 * 2**20
"""Bytes per tensor of the synthetic state dict (a 1.7B model's largest, the embedding, is ~0.6 GB)."""


def state_of(gb: float, version: int) -> dict[str, torch.Tensor]:
    """`gb` GB of bf16 tensors, every element `version`."""
    total, out, i = int(gb * 1e9), {}, 0
    while total > 0:
        n = min(CHUNK, total) // 2
        out[f"model.layers.{i}.weight"] = torch.full((n,), float(version), dtype=torch.bfloat16)
        total -= n * 2
        i += 1
    return out


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


async def publish(cfg: Config, gb: float, run_dir: Path) -> None:
    broker = await connect(cfg.broker.url, retries=5)
    pub = make_publisher(cfg, broker, run_dir)
    state = state_of(gb, 0)
    emit(ready=True)
    for line in sys.stdin:
        version = int(line)
        for t in state.values():
            t.fill_(float(version))
        t0 = time.time()
        h = await pub.publish(version, state)
        emit(version=version, created_at=h.created_at, publish_s=round(time.time() - t0, 4), bytes=h.bytes)
    await pub.close()
    await broker.close()


async def read(cfg: Config, run_dir: Path) -> None:
    broker = await connect(cfg.broker.url, retries=5)
    loader = make_loader(cfg, broker, run_dir)
    loader.local_copies = 1  # one copy in this host's memory: the bench's 3.4 GB versions must fit
    held = 0
    emit(ready=True)
    while True:
        newest = await loader.latest()
        if newest is not None and newest.version > held:
            try:
                path = await loader.fetch(newest)
                held = newest.version
                emit(version=held, ready_at=time.time(), source=getattr(loader, "last_source", cfg.weights.backend))
                del path
            except WeightStoreError as exc:
                emit(error=str(exc), version=newest.version)
        await loader.wait_for_publish(0.2)


def main() -> None:
    cmd, cfg_json = sys.argv[1], sys.argv[2]
    cfg = Config.model_validate_json(Path(cfg_json).read_text())
    run_dir = Path(cfg_json).parent
    asyncio.run(publish(cfg, float(sys.argv[3]), run_dir) if cmd == "publish" else read(cfg, run_dir))


if __name__ == "__main__":
    main()
