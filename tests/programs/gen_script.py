"""Scenarios for one real GeneratorWorker (vLLM CPU engine, real redis), results as JSON.

Run by tests/integration/generate/test_generator.py in a subprocess (vLLM starts its EngineCore in a
child process, so this needs a __main__ guard, and one engine start serves every scenario):

    python tests/programs/gen_script.py spec.json out.json

spec.json: redis_url, run, run_dir, model (tiny model dir), perturbed / peaked (safetensors files).
Scenarios, in order: late join (versions 1, 2 published before the worker starts; version 2's files
gone at its first fetch, then back), an in-flight
switch to version 3 (`peaked`), a group admitted at version 4 waiting for it, the in-flight switch
again (version 5) with a delta per token, a prompt vLLM
rejects, then stop with a group that can never start (admitted at 99): aborted, left un-acked.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from pathlib import Path

GROUP_SIZE = 4


async def _pull(broker, keys, state: dict, block_ms: int | None = 100) -> None:
    """Append every rollout published since the last pull to state["rollouts"]."""
    from streamrl.core.messages import as_dict, decode

    for e in await broker.read(keys.rollouts, state["last_id"], count=100, block_ms=block_ms):
        state["last_id"] = e.id
        state["rollouts"].append(as_dict(decode(e.data)))


async def _collect(broker, keys, state: dict, group_id: str, n: int, timeout: float = 90.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [r for r in state["rollouts"] if r["group_id"] == group_id]
        if len(done) >= n:
            return sorted(done, key=lambda r: r["sample"])
        await _pull(broker, keys, state)
    raise TimeoutError(
        f"only {len([r for r in state['rollouts'] if r['group_id'] == group_id])}/{n} "
        f"rollouts of group {group_id} after {timeout}s"
    )


def generator_config(spec: dict, group_size: int, generator: dict, weights: str = "shm", **sections):
    """The Config every generator script runs: the spec's run, redis and model dir, a group of
    `group_size`, the scripts' common generator settings updated by `generator`, `weights` keeping 2
    versions; `sections` (model, rollout, trainer) replace their default."""
    from streamrl.config.schema import (
        BrokerConfig,
        Config,
        GeneratorConfig,
        ModelConfig,
        RolloutConfig,
        RunConfig,
        WeightsConfig,
    )

    common = dict(temperature=0.7, ignore_eos=True, max_inflight_groups=4, drain_timeout_s=0.5, weights_poll_s=0.05)
    defaults = {"model": ModelConfig(path=spec["model"]), "rollout": RolloutConfig(group_size=group_size)}
    return Config(
        run=RunConfig(name=spec["run"], seed=0),
        broker=BrokerConfig(url=spec["redis_url"], claim_idle_ms=60_000, block_ms=50),
        generator=GeneratorConfig(**{**common, **generator}),
        weights=WeightsConfig(backend=weights, keep=2),
        **{**defaults, **sections},
    )


async def submit_prompt(broker, keys, group_id: str, text: str, group_size: int, admitted: int) -> None:
    """Queue `text` as one group's prompt. As in a real run, the feeder admits at the trainer's version,
    which is set (after the step) before that version's weights are published."""
    from streamrl.core.messages import Prompt, encode
    from streamrl.models.tiny import vocab

    v = vocab()
    await broker.set(keys.trainer_version, max(admitted, int(await broker.get(keys.trainer_version) or 0)))
    ids = [v["<s>"]] + [v[c] for c in text]
    msg = Prompt(group_id=group_id, prompt_ids=ids, group_size=group_size, admitted_version=admitted, text=text)
    await broker.add(keys.prompts, encode(msg))


async def main(spec: dict) -> dict:
    import torch
    from safetensors.torch import load_file

    from brokers.connect import connect
    from streamrl.core.broker import Keys
    from streamrl.core.logs import setup_logging
    from streamrl.weights.files import version_dirs
    from streamrl.weights.store import make_publisher
    from workers.generator import GeneratorWorker

    torch.set_num_threads(1)
    run_dir = Path(spec["run_dir"])
    setup_logging("generator", "gen-0", run_dir)
    cfg = generator_config(spec, GROUP_SIZE, dict(max_tokens=200, loop_profile_s=0.005))
    broker = await connect(cfg.broker.url)
    keys = Keys.of(cfg)
    store = make_publisher(cfg, broker, run_dir)
    perturbed, peaked = load_file(spec["perturbed"]), load_file(spec["peaked"])
    state = {"rollouts": [], "last_id": "0"}
    out: dict = {}

    async def submit(group_id: str, admitted: int, text: str = "abc") -> float:
        await submit_prompt(broker, keys, group_id, text, GROUP_SIZE, admitted)
        return time.time()

    try:
        await store.publish(1, perturbed)
        h2 = await store.publish(2, perturbed)
        # Version 2's files gone before the worker fetches them (as a fast trainer's gc does): its join
        # reads the newest again instead of failing the start; the files come back once it has failed.
        held_back = Path(spec["run_dir"]) / "held-back-v2"
        shutil.move(h2.handle, held_back)
        worker = GeneratorWorker(cfg, broker, "gen-0", run_dir)
        t0 = time.time()
        run = asyncio.create_task(worker.run())
        while not worker.stats.get("join_fetch_failed"):
            assert not run.done(), run.exception() if not run.cancelled() else "cancelled"
            await asyncio.sleep(0.01)
        shutil.move(held_back, h2.handle)
        out["join_fetch_failed"] = worker.stats["join_fetch_failed"]

        # 1. late join + basic group: must be generated with version 2
        sent = await submit("late", admitted=0)
        out["late"] = await _collect(broker, keys, state, "late", GROUP_SIZE)
        out["startup_s"] = sent - t0
        from vllm import envs

        out["vllm_envs_cached"] = envs._is_envs_cache_enabled()
        out["late_wall_s"] = max(r["finished_at"] for r in out["late"]) - sent

        # 2. in-flight switch: publish version 3 once tokens are being made (generator.stream_interval
        # 0, the default: each request's tokens come in one output at its end)
        base = worker.requests.deliveries
        sent = await submit("switch", admitted=2)
        while worker.requests.tokens_made(worker.engine) < 4 * GROUP_SIZE:
            await asyncio.sleep(0.002)
        out["switch_made_at_publish"] = worker.requests.tokens_made(worker.engine)
        h3 = await store.publish(3, peaked)
        out["switch"] = await _collect(broker, keys, state, "switch", GROUP_SIZE)
        out["switch_deliveries"] = worker.requests.deliveries - base
        out["switch_stats"] = {k: worker.stats.get(k) for k in ("last_switch_latency_s", "last_switch_paused_s")}
        out["switch_publish_s"] = time.time() - h3.created_at
        out["switch_wall_s"] = max(r["finished_at"] for r in out["switch"]) - sent

        # 3. a group admitted at version 4 waits until version 4 is published
        await submit("gate", admitted=4)
        await asyncio.sleep(1.0)
        await _pull(broker, keys, state, block_ms=200)
        out["gate_before_publish"] = len([r for r in state["rollouts"] if r["group_id"] == "gate"])
        out["gate_published_at"] = time.time()
        await store.publish(4, perturbed)
        out["gate"] = await _collect(broker, keys, state, "gate", GROUP_SIZE)

        # 3b. the same in-flight switch (version 5, `peaked`) streaming a delta per token
        worker.cfg.generator.stream_interval = 1
        base = worker.requests.deliveries
        await submit("switch_delta", admitted=4)
        while worker.requests.deliveries - base < 4 * GROUP_SIZE:
            await asyncio.sleep(0.002)
        await store.publish(5, peaked)
        out["switch_delta"] = await _collect(broker, keys, state, "switch_delta", GROUP_SIZE)
        out["switch_delta_deliveries"] = worker.requests.deliveries - base
        out["versions_on_disk"] = sorted(version_dirs(store.root))

        # 4. a prompt vLLM refuses (longer than max_model_len) is dead-lettered and acked
        await submit("toolong", admitted=0, text="x" * 300)
        for _ in range(200):
            if await broker.stream_len(keys.deadletter):
                break
            await asyncio.sleep(0.05)
        out["deadletter"] = [e.data.split(b"\n", 1)[0].decode() for e in await broker.read(keys.deadletter, "0")]

        # 5. stop with a group that can never start: aborted after drain_timeout_s, left un-acked
        await submit("never", admitted=99)
        await asyncio.sleep(0.5)
        worker.stop()
        await asyncio.wait_for(run, timeout=60)
        out["pending_after_stop"] = {g["name"]: g["pending"] for g in await broker.group_info(keys.prompts)}
        out["heartbeat_after_stop"] = await broker.get(keys.worker("generator", "gen-0"))
        out["stats"] = dict(worker.stats)
        out["fetched_dir_left"] = worker.loader.cache_dir.exists()
        await _pull(broker, keys, state, block_ms=None)
        out["rollouts_per_group"] = {}
        for r in state["rollouts"]:
            out["rollouts_per_group"][r["group_id"]] = out["rollouts_per_group"].get(r["group_id"], 0) + 1
    finally:
        await broker.close()
        shutil.rmtree(store.root, ignore_errors=True)
    return out


if __name__ == "__main__":
    spec = json.loads(Path(sys.argv[1]).read_text())
    result = asyncio.run(main(spec))
    Path(sys.argv[2]).write_text(json.dumps(result, default=str))
