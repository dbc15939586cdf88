"""Scenarios for one GeneratorWorker whose vLLM engine spans two CPU workers (generator.tensor_parallel_size=2),
results as JSON. Run by tests/integration/generate/test_generator_tp.py in a subprocess (one engine
start, ~70 s on 2 cores, serves every scenario):

    python tests/programs/tp_script.py spec.json out.json

spec.json: redis_url, run, run_dir, model (tiny model dir), peaked (a safetensors file).
Scenarios, in order: a group on the initial weights; an in-flight switch to version 1 (`peaked`,
shm backend) with each TP worker's weights compared with the published file before and after; then
one TP worker SIGKILLed while a group is in flight: how the generator ends, and what is left of
the group (its prompt pending, for another generator to claim).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from tests.programs.gen_script import _collect, _pull, generator_config, submit_prompt

GROUP_SIZE = 4
EXTENSION = "tests.programs.tp_extension.TPCheck"


async def main(spec: dict) -> dict:
    import torch
    from safetensors.torch import load_file

    from brokers.connect import connect
    from streamrl.core.broker import Keys
    from streamrl.core.logs import setup_logging
    from streamrl.core.messages import decode
    from streamrl.generate.engine_errors import is_engine_dead
    from streamrl.weights.shm import ShmLoader
    from streamrl.weights.store import make_publisher
    from workers.generator import GROUP, GeneratorWorker

    torch.set_num_threads(1)
    run_dir = Path(spec["run_dir"])
    setup_logging("generator", "gen-0", run_dir)
    cfg = generator_config(spec, GROUP_SIZE, dict(tensor_parallel_size=2, max_tokens=200))
    # The test's worker extension: each TP worker answers what it holds (the shm backend needs none).
    ShmLoader.vllm_extension = EXTENSION
    broker = await connect(cfg.broker.url)
    keys = Keys.of(cfg)
    store = make_publisher(cfg, broker, run_dir)
    peaked = load_file(spec["peaked"])
    base_file = str(Path(spec["model"]) / "model.safetensors")
    state = {"rollouts": [], "last_id": "0"}
    out: dict = {}

    async def submit(group_id: str, admitted: int) -> None:
        await submit_prompt(broker, keys, group_id, "abc", GROUP_SIZE, admitted)

    async def diffs(path: str) -> list[dict[str, float]]:
        return await worker.engine.llm.collective_rpc("tp_weights_diff", kwargs={"path": path})

    async def tokens_made(n: int) -> None:
        while worker.requests.tokens_made(worker.engine) < n:
            assert not run.done(), run.exception() if not run.cancelled() else "cancelled"
            await asyncio.sleep(0.002)

    try:
        worker = GeneratorWorker(cfg, broker, "gen-0", run_dir)
        t0 = time.time()
        run = asyncio.create_task(worker.run())
        await submit("first", admitted=0)
        out["first"] = await _collect(broker, keys, state, "first", GROUP_SIZE, timeout=480)
        out["startup_s"] = time.time() - t0
        out["ranks"] = [list(r) for r in await worker.engine.llm.collective_rpc("tp_rank_and_pid")]
        out["diff_base_before"] = await diffs(base_file)

        # An in-flight switch: version 1 (`peaked`) published once every request has made tokens.
        await submit("switch", admitted=0)
        await tokens_made(4 * GROUP_SIZE)
        h1 = await store.publish(1, peaked)
        out["switch"] = await _collect(broker, keys, state, "switch", GROUP_SIZE)
        out["publish_to_ready_s"] = worker.stats.get("last_switch_latency_s")
        out["switch_phases"] = worker.stats.get("last_switch_phases")
        # Every worker holds exactly the published version (and no longer the initial weights).
        out["diff_published_after"] = await diffs(h1.handle + "/model.safetensors")
        out["diff_base_after"] = await diffs(base_file)

        # One TP worker (rank 1) SIGKILLed with a group in flight.
        await submit("killed", admitted=1)
        await tokens_made(GROUP_SIZE)
        killed_at = time.monotonic()
        os.kill(out["ranks"][1][1], signal.SIGKILL)
        try:
            await asyncio.wait_for(run, timeout=120)
            out["run_ended"] = "returned"
        except asyncio.TimeoutError:
            out["run_ended"] = "still running after 120 s"
        except Exception as exc:
            out["run_ended"] = f"{type(exc).__name__}: {exc}"
            out["engine_dead"] = is_engine_dead(exc)
        out["ended_after_kill_s"] = round(time.monotonic() - killed_at, 2)
        out["pending_after_kill"] = {g["name"]: g["pending"] for g in await broker.group_info(keys.prompts)}
        # What another generator does with it: XAUTOCLAIM of the dead consumer's pending prompt.
        claimed = await broker.claim_idle(keys.prompts, GROUP, "gen-1", min_idle_ms=0)
        out["claimed_groups"] = [decode(e.data).group_id for e in claimed]
        await asyncio.sleep(0.5)
        await _pull(broker, keys, state, block_ms=None)
        out["killed_rollouts"] = len([r for r in state["rollouts"] if r["group_id"] == "killed"])
        # The surviving worker exits on its own once the executor is gone (vLLM's parent-death watch);
        # under `streamrl up` the supervisor also kills the generator's whole process group.
        deadline = time.monotonic() + 30
        while (left := [p for _, p in out["ranks"] if _alive(p)]) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        out["engine_processes_left"] = left
        out["workers_gone_after_kill_s"] = round(time.monotonic() - killed_at, 2)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    finally:
        await broker.close()
        shutil.rmtree(store.root, ignore_errors=True)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


if __name__ == "__main__":
    spec = json.loads(Path(sys.argv[1]).read_text())
    result = asyncio.run(main(spec))
    Path(sys.argv[2]).write_text(json.dumps(result, default=str))
