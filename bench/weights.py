"""Weight sync bench: trainer stall per publish, publish -> generator-ready latency, and generator tok/s
with streamrl around vLLM vs plain vLLM (same engine, same settings, side by side in one run).

Two processes, as in a real job: the generator side (a real GeneratorWorker; vLLM's EngineCore is
its child process) here, the trainer side (a real FSDP2 HFEngine, one rank, and the publisher:
bench/weights_trainer.py) in a child process, driven over the broker. Throughput rounds alternate plain
vLLM (requests straight into AsyncLLM) and streamrl (prompts through Redis, rollouts back) on the
one started engine. Then the trainer side changes its weights and publishes `--publishes` times
while the generator is busy: stall = time of the snapshot call the training loop makes
(`WeightPublisher.snapshot`), ready = publish start -> the generator generating with the new version.

    streamrl bench weights --out /tmp/w                                   # CPU: tiny Qwen3, shm
    streamrl bench weights --shape qwen3-1.7b --dtype bfloat16 --out /tmp/w   # GPU: cuda_ipc
    streamrl bench weights --tensor-parallel-size 2 --out /tmp/w          # CPU: one engine of 2 workers
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import msgpack

from bench.weights_trainer import CONTROL, REPORTS

HELP = "weight sync: trainer stall, publish->ready latency, streamrl vs plain vLLM tok/s"
TARGETS = {"ready_s": 0.5, "stall_s": 0.05, "throughput_ratio": 0.95}
"""The issue's done-when numbers (1.7B shape, bf16, one GPU host)."""


def add_arguments(p) -> None:
    p.add_argument("--shape", default="qwen3-tiny", help="streamrl.models.shapes shape built with random weights")
    p.add_argument("--model", help="an existing HF model folder instead of --shape")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on GPU, float32 on CPU")
    p.add_argument("--backend", default=None, help="weights.backend (default: cuda_ipc on GPU, shm on CPU)")
    p.add_argument("--requests", type=int, default=16, help="concurrent requests per round (groups of 8)")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=32, help="fixed generation length (ignore_eos)")
    p.add_argument("--rounds", type=int, default=1, help="plain/streamrl round pairs (alternating)")
    p.add_argument("--publishes", type=int, default=2)
    p.add_argument(
        "--switch-kv",
        default="keep",
        help="generator.switch_kv_cache per publish, cycled: keep, recompute or keep,recompute (side by side)",
    )
    p.add_argument("--poll-s", type=float, default=None, help="generator.weights_poll_s (default: the config's)")
    p.add_argument(
        "--loop-profile-s",
        type=float,
        default=0.0,
        help="generator.loop_profile_s: profile the generator's loop every this many s (0: off); "
        "with --out the profile lands in OUT/bench-gen.loop_profile.txt",
    )
    p.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    p.add_argument("--cuda-graphs", action="store_true", help="vLLM CUDA graphs (enforce_eager=False)")
    p.add_argument(
        "--no-compile",
        action="store_true",
        help="generator.compile=false: vLLM uncompiled, full CUDA graphs kept with --cuda-graphs (run once "
        "with and once without, in one call, to compare tok/s and the engine's start)",
    )
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        help="generator.max_num_seqs (default: vLLM's, 128 on a GPU; the GPU configs run 256)",
    )
    p.add_argument(
        "--lora-rank",
        type=int,
        default=0,
        help="trainer.lora.rank: publish a LoRA adapter of this rank on q/k/v/o_proj, served by vLLM as a LoRA "
        "(0: full weights). Run once with and once without to compare bytes, ready and tok/s",
    )
    p.add_argument(
        "--stream-interval",
        type=int,
        default=None,
        help="generator.stream_interval, tokens per delta, 0: one output per request (default: the config's); "
        "plain vLLM streams every token",
    )
    p.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="generator.tensor_parallel_size: one engine over this many devices (CPU: workers of the "
        "host's cores); every publish is loaded by each TP worker",
    )
    p.add_argument("--broker", help="redis:// URL (default: a private embedded server)")
    p.add_argument("--cache", default=None, help="where built models go (default: the temp dir)")


def _config(args, url: str, model: str, dtype: str, backend: str):
    from streamrl.config.schema import (
        BrokerConfig,
        Config,
        GeneratorConfig,
        LoraConfig,
        ModelConfig,
        RolloutConfig,
        RunConfig,
        TrainerConfig,
        WeightsConfig,
    )

    return Config(
        run=RunConfig(name=f"benchw-{uuid.uuid4().hex[:6]}"),
        broker=BrokerConfig(url=url, block_ms=20, claim_idle_ms=600_000),
        model=ModelConfig(path=model, dtype=dtype),
        rollout=RolloutConfig(group_size=8),
        generator=GeneratorConfig(
            max_tokens=args.max_tokens,
            tensor_parallel_size=args.tensor_parallel_size,
            ignore_eos=True,
            temperature=1.0,
            max_inflight_groups=max(1, args.requests // 8),
            gpu_memory_utilization=args.gpu_memory_utilization,
            enforce_eager=not args.cuda_graphs,
            compile=not args.no_compile,
            drain_timeout_s=2.0,
            **({"weights_poll_s": args.poll_s} if args.poll_s else {}),
            loop_profile_s=args.loop_profile_s,
            max_num_seqs=args.max_num_seqs,
            **({"stream_interval": args.stream_interval} if args.stream_interval else {}),
            max_model_len=args.prompt_len + args.max_tokens + 16,
        ),
        trainer=TrainerConfig(lr=1e-6, lora=LoraConfig(rank=args.lora_rank)),
        weights=WeightsConfig(backend=backend, keep=3),
    )


async def _plain(engine, prompts: list[list[int]], seed0: int) -> tuple[int, float, float]:
    """Every (prompt, sample) straight into vLLM, all at once: tokens, seconds, first completion's seconds."""
    t0 = time.perf_counter()
    done: list[float] = []

    async def one(i: int, ids: list[int]) -> int:
        n = 0
        async for out in engine.llm.generate(
            {"prompt_token_ids": ids}, engine.sampling_params(seed0 + i), f"plain-{seed0}-{i}"
        ):
            n += len(out.outputs[0].token_ids)  # DELTA outputs: the new tokens only
        done.append(time.perf_counter() - t0)
        return n

    counts = await asyncio.gather(*(one(i, ids) for i, ids in enumerate(p for p in prompts for _ in range(8))))
    return sum(counts), time.perf_counter() - t0, min(done)


async def _through_streamrl(worker, broker, prompts: list[list[int]], tag: str, last_id: str):
    """The same requests as prompt groups through Redis; done when every rollout is on the stream."""
    from streamrl.core.messages import Prompt, decode, encode

    t0 = time.perf_counter()
    for g, ids in enumerate(prompts):
        await broker.add(
            worker.keys.prompts,
            encode(
                Prompt(group_id=f"{tag}-{g}", prompt_ids=ids, group_size=8, admitted_version=worker.weights.version)
            ),
        )
    want, tokens, first = 8 * len(prompts), 0, None
    while want:
        for e in await broker.read(worker.keys.rollouts, last_id, count=512, block_ms=100):
            last_id = e.id
            r = decode(e.data)
            if r.group_id.startswith(f"{tag}-"):
                want -= 1
                tokens += len(r.completion_ids)
                first = first or time.perf_counter() - t0
    return tokens, time.perf_counter() - t0, first, last_id


async def _bench(args, url: str, tmp: Path) -> dict:
    import numpy as np
    import torch

    from brokers.connect import connect
    from streamrl.models.shapes import build_random_model
    from workers.generator import GeneratorWorker

    gpu = torch.cuda.device_count() > 0  # NVML: this process must not initialise CUDA before vLLM forks
    dtype = args.dtype or ("bfloat16" if gpu else "float32")
    backend = args.backend or ("cuda_ipc" if gpu else "shm")
    model = args.model or str(build_random_model(args.shape, Path(args.cache or tmp) / f"{args.shape}-{dtype}", dtype))
    cfg = _config(args, url, model, dtype, backend)
    broker = await connect(url)
    worker = GeneratorWorker(cfg, broker, "bench-gen", tmp / "run")
    await worker.start()  # engine up before the trainer touches the GPU
    rng = np.random.default_rng(0)
    n_groups = max(1, args.requests // 8)
    prompts = [rng.integers(4, 90, size=args.prompt_len).tolist() for _ in range(n_groups)]

    loop_task = asyncio.create_task(_loop(worker))
    rounds, last_id = [], "0"
    await _plain(worker.engine, prompts[:1], 10_000)  # warm-up (first-request compiles)
    for r in range(args.rounds):
        # CPU seconds of this thread (the one event loop: vLLM's output handler and streamrl's per-delta
        # work) per token: unlike tok/s on a shared CPU, not moved by other processes' load.
        c0 = time.thread_time()
        pt, ps, pfirst = await _plain(worker.engine, prompts, 1000 * r)
        c1 = time.thread_time()
        st, ss, sfirst, last_id = await _through_streamrl(worker, broker, prompts, f"tp{r}", last_id)
        c2 = time.thread_time()
        rounds.append(
            {
                "round": r,
                "plain_tok_s": pt / ps,
                "streamrl_tok_s": st / ss,
                "tokens": st,
                "plain_s": ps,
                "streamrl_s": ss,
                "plain_first_done_s": pfirst,
                "plain_loop_cpu_us_per_token": (c1 - c0) / pt * 1e6,
                "streamrl_loop_cpu_us_per_token": (c2 - c1) / st * 1e6,
                "streamrl_first_done_s": sfirst,
            }
        )

    trainer, ready, reports_id = await _start_trainer(cfg, broker, tmp)
    first_stall, params = ready["first_stall_s"], ready["params"]
    publishes = []
    background = asyncio.create_task(_keep_busy(worker, broker, prompts))
    modes = [m.strip() for m in args.switch_kv.split(",")]
    for v in range(1, args.publishes + 1):
        worker.cfg.generator.switch_kv_cache = modes[(v - 1) % len(modes)]
        preempted0 = worker.engine.prefix_cache.get("preempted", 0)
        report, reports_id = await _publish(broker, trainer, v, reports_id)
        stall, stall_sync, published, t_pub = (
            report["stall_s"],
            report["stall_gpu_done_s"],
            report["publish_s"],
            report["published_at"],
        )
        while worker.stats.get("policy_version", 0) < v:  # set once the engine has resumed with v
            _alive(background, loop_task)
            await asyncio.sleep(0.001)
        # The engine's first step with v: a running request's count moves (or one finishes); with
        # generator.stream_interval 0 no delta arrives before a request ends.
        t_ready, made = time.time(), worker.requests.tokens_made(worker.engine)
        while worker.requests.tokens_made(worker.engine) == made:
            _alive(background, loop_task)
            await asyncio.sleep(0.001)
        first_token = time.time() - t_ready
        await asyncio.sleep(0.2)  # re-prefills after a recompute switch are scheduled by then
        publishes.append(
            {
                "version": v,
                "kv": worker.cfg.generator.switch_kv_cache,
                "stall_s": stall,
                "stall_gpu_done_s": stall_sync,
                "publish_s": published,
                "bytes": report.get("bytes"),
                "ready_s": t_ready - t_pub,
                "first_token_s": first_token,
                "paused_s": worker.stats.get("last_switch_paused_s"),
                **(worker.stats.get("last_switch_phases") or {}),
                "preempted": worker.engine.prefix_cache.get("preempted", 0) - preempted0,
                "active_requests": worker.requests.active,
            }
        )
        await asyncio.sleep(0.3)  # generation runs on between publishes
    background.cancel()
    worker.stop()
    await asyncio.gather(loop_task, background, return_exceptions=True)
    await _within(worker.close(), 60, "generator close")
    profile = tmp / "run" / "logs" / "bench-gen.loop_profile.txt"  # the temp dir goes: keep it in OUT
    if profile.exists() and args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        shutil.copy(profile, Path(args.out) / profile.name)
    await broker.add(CONTROL, msgpack.packb({"version": 0}))  # the trainer frees its copies and exits
    await _within(trainer.wait(), 60, "trainer process exit")
    await broker.close()

    plain = statistics.mean(r["plain_tok_s"] for r in rounds)
    ours = statistics.mean(r["streamrl_tok_s"] for r in rounds)
    ready = [p["ready_s"] for p in publishes]
    stall = [p["stall_s"] for p in publishes]
    return {
        "settings": {
            **{k: v for k, v in vars(args).items() if k not in ("func",)},
            "dtype": dtype,
            "backend": backend,
            "model": model,
            "device": torch.cuda.get_device_name() if gpu else "cpu",
            "params": params,
        },
        "rounds": rounds,
        "publishes": publishes,
        "plain_tok_s": plain,
        "streamrl_tok_s": ours,
        "throughput_ratio": ours / plain,
        "plain_loop_cpu_us_per_token": statistics.mean(r["plain_loop_cpu_us_per_token"] for r in rounds),
        "streamrl_loop_cpu_us_per_token": statistics.mean(r["streamrl_loop_cpu_us_per_token"] for r in rounds),
        "ready_s_median": statistics.median(ready),
        "ready_s_max": max(ready),
        "stall_s_median": statistics.median(stall),
        "stall_s_max": max(stall),
        "first_stall_s": first_stall,
        "targets": TARGETS,
        "loop_profile": {k: v for k, v in worker.stats.items() if k.startswith("loop_profile_")},
    }


def _alive(*tasks: asyncio.Task) -> None:
    """Raise a background task's error now: the waits above would otherwise spin for ever on a
    generator that gets no more work (a renamed attribute in _keep_busy once did exactly that)."""
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise RuntimeError(f"bench task {task.get_coro().__name__} died") from task.exception()


async def _within(coro, seconds: float, what: str):
    """Await with a deadline; on expiry print every task's stack (where it hangs) and raise."""
    try:
        return await asyncio.wait_for(coro, seconds)
    except TimeoutError:
        for task in asyncio.all_tasks():
            task.print_stack()
        raise TimeoutError(f"{what} did not finish within {seconds}s (task stacks above)") from None


async def _loop(worker) -> None:
    while not worker.stopping.is_set():
        await worker.step()


async def _keep_busy(worker, broker, prompts) -> None:
    """Keep the generator full while versions are published (switches happen mid-generation)."""
    from streamrl.core.messages import Prompt, encode

    i = 0
    while True:
        if worker.groups.free() > 0:
            i += 1
            await broker.add(
                worker.keys.prompts,
                encode(
                    Prompt(group_id=f"busy-{i}", prompt_ids=prompts[i % len(prompts)], group_size=8, admitted_version=0)
                ),
            )
        await asyncio.sleep(0.05)


async def _start_trainer(cfg, broker, tmp: Path):
    """The trainer side as its own process (bench/weights_trainer.py); waits for its first snapshot."""
    spec = tmp / "trainer-spec.json"
    spec.write_text(json.dumps({"config": cfg.model_dump(mode="json"), "run_dir": str(tmp / "run")}))
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "bench.weights_trainer", str(spec))
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.returncode is not None:
            raise RuntimeError(f"the bench's trainer process exited with code {proc.returncode} (its output is above)")
        for e in await broker.read(REPORTS, "0", count=1, block_ms=500):
            return proc, msgpack.unpackb(e.data), e.id
    raise TimeoutError("the bench's trainer process did not take its first snapshot within 600 s")


async def _publish(broker, trainer, version: int, last_id: str) -> tuple[dict, str]:
    """Ask the trainer process to change its weights and publish `version`; its report."""
    await broker.add(CONTROL, msgpack.packb({"version": version}))
    while True:
        if trainer.returncode is not None:
            raise RuntimeError(f"the bench's trainer process exited with code {trainer.returncode}")
        for e in await broker.read(REPORTS, last_id, count=1, block_ms=500):
            return msgpack.unpackb(e.data), e.id


def run(args) -> int:
    from bench.common import print_table, run_async, write_result
    from brokers.embedded import EmbeddedRedis

    # uvloop and the embedded server's unix socket, as a job's generator has them (streamrl.launch.runtime.serve).
    with tempfile.TemporaryDirectory(prefix="streamrl-benchw-") as tmp:
        if args.broker:
            result = run_async(_bench(args, args.broker, Path(tmp)))
        else:
            with EmbeddedRedis(Path(tmp) / "broker") as server:
                result = run_async(_bench(args, server.local_url, Path(tmp)))
    s = result["settings"]
    print(
        f"weights bench: {s['model']} ({s['params'] / 1e6:.1f}M params, {s['dtype']}, {s['device']}), "
        f"backend {s['backend']}, TP={args.tensor_parallel_size}, {args.requests} requests x {args.max_tokens} tokens"
    )
    print_table(
        [{k: round(v, 4) if isinstance(v, float) else v for k, v in p.items()} for p in result["publishes"]],
        [
            "version",
            "kv",
            "stall_s",
            "publish_s",
            "ready_s",
            "first_token_s",
            "notice_s",
            "fetch_s",
            "paused_s",
            "pause_s",
            "drain_s",
            "reload_s",
            "resume_s",
            "loop_lag_max_s",
            "preempted",
            "active_requests",
        ],
    )
    for mode in sorted({p["kv"] for p in result["publishes"]}):
        ready = [p["ready_s"] + p["first_token_s"] for p in result["publishes"] if p["kv"] == mode]
        print(
            f"switch_kv_cache={mode}: publish -> first new token median {statistics.median(ready):.3f} s, max {max(ready):.3f} s"
        )
    print(
        f"plain vLLM {result['plain_tok_s']:.0f} tok/s | streamrl {result['streamrl_tok_s']:.0f} tok/s | "
        f"ratio {result['throughput_ratio']:.3f} (target >= {TARGETS['throughput_ratio']})"
    )
    sizes = [p["bytes"] for p in result["publishes"] if p.get("bytes")]
    if sizes:
        kind = f"LoRA rank {args.lora_rank} adapter" if args.lora_rank else "full weights"
        print(f"bytes per publish ({kind}): median {statistics.median(sizes):,.0f}")
    print(
        f"event-loop thread CPU per token: plain vLLM {result['plain_loop_cpu_us_per_token']:.1f} us | "
        f"streamrl {result['streamrl_loop_cpu_us_per_token']:.1f} us"
    )
    print(
        f"stall median {result['stall_s_median'] * 1e3:.1f} ms (target <= 50) | ready median "
        f"{result['ready_s_median']:.3f} s, max {result['ready_s_max']:.3f} s (target <= 0.5)"
    )
    if top := result["loop_profile"].get("loop_profile_top_blocked"):
        print(
            f"loop held: {result['loop_profile']['loop_profile_blocked_samples']} blocked samples, in: {'; '.join(top)}"
        )
    path = write_result(args.out, result)
    if path:
        print(f"wrote {path}")
    return 0
