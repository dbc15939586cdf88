"""The trainer side of `streamrl bench weights`, in a process of its own as in a real job.

A real FSDP2 HFEngine (one rank) and the configured WeightPublisher. For each version the bench
asks for (an entry on the control stream), it changes every weight (an optimizer step's stand-in),
takes the snapshot the trainer's loop takes (the stall) and publishes it, then reports the stall,
the publish time and the publish's wall-clock start. It shares no event loop and no GIL with the
generator: an earlier in-process version measured the generator's busy event loop delaying the
publish's Redis calls by up to 1.2 s, which a real trainer never sees.

    python -m bench.weights_trainer SPEC.json      # started by bench/weights.py
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
import time
from pathlib import Path

CONTROL = "bench:weights:control"
"""Stream the bench writes {"version": v} (0: quit) to."""
REPORTS = "bench:weights:reports"
"""Stream this process writes {"ready": ...} once, then one report per published version."""


def perturb(engine, scale: float = 1e-3) -> None:
    """Stands in for an optimizer step: every local shard changes in place."""
    import torch

    with torch.no_grad():
        for p in engine.model.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            local.add_(torch.randn_like(local), alpha=scale)


def train_engine(cfg, model: str):
    import torch.distributed as dist

    from streamrl.train.dist import _init_group, free_port
    from streamrl.train.hf_engine import HFEngine

    if not dist.is_initialized():
        _init_group(0, 1, None, f"tcp://127.0.0.1:{free_port()}")
    return HFEngine(cfg, model, 0, 1)


async def serve(spec: dict) -> None:
    import msgpack
    import torch

    from brokers.connect import connect
    from streamrl.config.schema import Config
    from streamrl.weights.store import make_publisher, publisher_class

    cfg = Config.model_validate(spec["config"])
    gpu = torch.cuda.is_available()
    broker = await connect(cfg.broker.url)
    engine = train_engine(cfg, cfg.model.path)
    writer = make_publisher(cfg, broker, Path(spec["run_dir"]))
    gather = functools.partial(publisher_class(cfg.weights.backend).snapshot, dtype=cfg.model.dtype)
    t0 = time.perf_counter()
    gather(engine)  # the trainer's first snapshot also allocates its buffers
    first = time.perf_counter() - t0
    params = sum(p.numel() for p in engine.model.parameters())
    await broker.add(REPORTS, msgpack.packb({"ready": True, "first_stall_s": first, "params": params}))
    last = "0"
    while True:
        entries = await broker.read(CONTROL, last, count=1, block_ms=1000)
        if not entries:
            continue
        last = entries[0].id
        v = msgpack.unpackb(entries[0].data)["version"]
        if v == 0:
            break
        perturb(engine)
        if gpu:
            torch.cuda.synchronize()  # the step's own kernels are not the snapshot's cost
        t0 = time.perf_counter()
        state = gather(engine)  # on the training thread, as the trainer's loop takes it
        stall = time.perf_counter() - t0
        if gpu:
            torch.cuda.synchronize()
        stall_sync = time.perf_counter() - t0
        t_pub = time.time()
        await writer.publish(v, state)
        report = {
            "version": v,
            "stall_s": stall,
            "stall_gpu_done_s": stall_sync,
            "publish_s": time.time() - t_pub,
            "published_at": t_pub,
        }
        await broker.add(REPORTS, msgpack.packb(report))
    await writer.close()  # cuda_ipc: this process owns the published GPU copies until here
    await broker.close()


def main() -> int:
    asyncio.run(serve(json.loads(Path(sys.argv[1]).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
