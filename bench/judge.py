"""Judge throughput: rollouts per second one judge worker scores (read, render, its vLLM engine, parse,
write, ack) on a private redis-server, excluding its engine's start.

    python -m bench.judge                                          # configs/tiny-judge-cpu.yaml, 512 rollouts
    python -m bench.judge --rollouts 1024 --set judge.batch_size=128

The rollouts are charclass completions of 16 random characters, published before the clock starts;
the worker drains them in its loop (JudgeWorker.step). Prints one JSON object: rollouts, seconds,
rollouts_per_s, judge_errors, batch_size, engine_start_s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

import numpy as np

from bench.common import scratch_servers
from streamrl.config.files import load_config
from streamrl.core.messages import Rollout, encode
from streamrl.models.tiny import CHARS, resolve_model


def rollouts(n: int, seed: int = 0) -> list[Rollout]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        text = "".join(rng.choice(CHARS[:95]) for _ in range(16))
        out.append(
            Rollout(
                rollout_id=f"b{i}:0:n",
                group_id=f"b{i}",
                sample=0,
                group_size=1,
                prompt_ids=np.array([1]),
                completion_ids=np.array([4] * 16),
                logprobs=np.zeros(16, np.float32),
                version=0,
                prompt_text="lower:",
                text=text,
            )
        )
    return out


async def measure(url: str, config: str, overrides: list[str], n: int) -> dict:
    from brokers.connect import connect
    from workers.judge import JudgeWorker

    cfg = resolve_model(load_config(config, [*overrides, f"broker.url={url}", "run.name=bench-judge"]))
    broker = await connect(url, retries=3)
    worker = JudgeWorker(cfg, broker, "judge-bench")
    t0 = time.monotonic()
    await worker.start()
    started = time.monotonic() - t0
    try:
        for r in rollouts(n):
            await broker.add(worker.keys.rollouts, encode(r))
        t1 = time.monotonic()
        while await worker.step():
            pass
        seconds = time.monotonic() - t1
    finally:
        await worker.close()
        await broker.close()
    return {
        "rollouts": int(worker.stats.get("scored", 0)),
        "seconds": round(seconds, 2),
        "rollouts_per_s": round(worker.stats.get("scored", 0) / seconds, 1),
        "judge_errors": int(worker.stats.get("judge_errors", 0)),
        "batch_size": cfg.judge.batch_size,
        "engine_start_s": round(started, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/tiny-judge-cpu.yaml")
    p.add_argument("--rollouts", type=int, default=512)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    with scratch_servers(name="judge") as (url,):
        print(json.dumps(asyncio.run(measure(url, args.config, args.set, args.rollouts))))


if __name__ == "__main__":
    main()
