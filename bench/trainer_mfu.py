"""Trainer-step throughput and MFU, hf vs torchtitan backend, on a Qwen3-shaped model with random weights.

Each variant (a backend, optionally with compile / activation checkpointing) runs in its own
process: the real engine (streamrl.train.engines.make_engine) on one rank takes `--warmup` + `--steps`
full train steps on the same GRPO batch (rows of prompt + completion tokens, no padding), timed
with the device synchronized. tokens/s counts every token the step processes (prompt and
completion); MFU = tokens/s * FLOPs per token / the GPU's peak dense bf16 FLOP/s, with FLOPs per
token = 6 * (matmul parameters, lm_head included) + 12 * layers * heads * head_dim * seq_len
(torchtitan's convention: attention counted without the causal half).

Variant options (after the backend, joined by +): compile, ac, nochunk (the model's full logits
instead of trainer.logprob_chunk_tokens chunks), chunk=N, mbt=N (trainer.micro_batch_tokens),
mbs=N (trainer.micro_batch_size), bucket=N (trainer.seq_bucket; 1 = no length padding),
pack=N (trainer.pack_rows: rollouts packed into rows of N tokens, torchtitan only), kernel=eager|compiled
(trainer.logprob_kernel), lora=R (trainer.lora.rank: adapters only; the FLOPs above still count the
full-weight backward, so a LoRA variant's MFU is a comparison figure, its step time and memory the
measurement); parsed by bench/trainer_variants.py.
--ragged draws each completion's length uniformly in 1..completion-len (pad waste; tokens/s counts
real tokens). --prompt-jitter J draws each prompt's length uniformly in prompt-len..prompt-len+J and
gives every step its own batch, so the longest row may change by a few tokens from step to step as in
a real job. --job-warm-up first runs the trainer's start-up warm-up (workers/trainer.warm_up with
generator.max_tokens = completion-len), so torch.compile has compiled what a real job's trainer has
when its first batch arrives. The real 0.6B job's rows and start-up (charclass prompts of 6-7
characters, 256 completion tokens): --rows 128 --prompt-len 6 --prompt-jitter 2 --completion-len 256
--job-warm-up; bucket=1 gives the dynamic-shape graph such a job trained on before trainer.seq_bucket.
--profile runs one more step under torch.profiler after the timed ones: its kernel time by category
(bench/trainer_profile.py) is printed and kept in result.json, its chrome trace in
trainer_mfu_<variant>_trace.json.gz. --checkpoint also times, per variant, a blocking save and two
background saves (streamrl.train.checkpoint.Checkpointer): the training thread's stall and the write's duration.
--publish times packing the weights on the device as a cuda_ipc publish does, from the engine's
weight stream and from the whole-state default (full_state_dict) for comparison. A variant
that runs out of GPU memory is reported as OOM with its peak, and the others still run.

    python -m bench.trainer_mfu --config configs/qwen3-1.7b-train.yaml --variants hf,torchtitan   # GPU
    python -m bench.trainer_mfu --shape qwen3-tiny --device cpu --rows 8 --prompt-len 16 --completion-len 16

`--out DIR` (created up front) keeps result.json and each variant's raw trainer_mfu_<variant>.json;
without it those per-variant files live in a temporary directory.
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

from streamrl.train.flops import PEAK_BF16_TFLOPS, flops_per_token

HELP = "trainer step tokens/s and MFU for the hf and torchtitan backends"


def add_arguments(p) -> None:
    p.add_argument("--config", default="configs/qwen3-1.7b-train.yaml")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="config override a.b=c")
    p.add_argument(
        "--shape", default="qwen3-1.7b", help="streamrl.models.shapes shape built when model.path is missing"
    )
    p.add_argument("--device", default=None, help="trainer.device override (cpu for the smoke run)")
    p.add_argument(
        "--variants",
        default="hf,torchtitan",
        help="comma list of BACKEND[+compile][+ac][+nochunk][+chunk=N][+mbt=N][+mbs=N][+bucket=N][+pack=N][+kernel=K], "
        "e.g. hf+nochunk,hf,torchtitan+compile+mbs=64",
    )
    p.add_argument("--rows", type=int, default=32, help="rollouts per batch (groups of 8)")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--completion-len", type=int, default=1536)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--peak-tflops", type=float, default=None, help="default: by GPU name (H100/H200 989)")
    p.add_argument("--ragged", action="store_true", help="completion lengths uniform in 1..completion-len")
    p.add_argument(
        "--prompt-jitter",
        type=int,
        default=0,
        help="prompt lengths uniform in prompt-len..prompt-len+J, a new batch every step (0: one fixed batch)",
    )
    p.add_argument(
        "--job-warm-up",
        action="store_true",
        help="before the --warmup steps, the trainer's start-up warm-up (trainer.warm_up) for completions of "
        "--completion-len tokens, as a real job runs it",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="profile one extra step: kernel time per category (gemm, attention, ...) and idle, plus a chrome trace",
    )
    p.add_argument(
        "--checkpoint", action="store_true", help="also time a blocking and two background checkpoint saves per variant"
    )
    p.add_argument("--checkpoint-dir", default=None, help="where the timed checkpoints go (default: a temp dir)")
    p.add_argument(
        "--publish",
        action="store_true",
        help="also time packing the weights on the trainer's device (a cuda_ipc publish), from the engine's "
        "weight stream and from the whole-state default",
    )


def make_batch(
    rows: int,
    prompt_len: int,
    completion_len: int,
    vocab: int,
    seed: int = 0,
    ragged: bool = False,
    prompt_jitter: int = 0,
):
    import numpy as np

    from streamrl.core.batch import Batch
    from streamrl.core.messages import Rollout

    rng = np.random.default_rng(seed)
    group = 8 if rows % 8 == 0 else rows
    lengths = rng.integers(1, completion_len + 1, rows) if ragged else np.full(rows, completion_len)
    # Drawn only with a jitter, so the fixed-length batches stay the ones earlier runs measured.
    prompts = rng.integers(prompt_len, prompt_len + prompt_jitter + 1, rows) if prompt_jitter else [prompt_len] * rows
    rollouts = [
        Rollout(
            rollout_id=f"g{i // group}:{i % group}",
            group_id=f"g{i // group}",
            sample=i % group,
            group_size=group,
            prompt_ids=rng.integers(4, vocab, int(prompts[i])).astype(np.int32),
            completion_ids=rng.integers(4, vocab, int(n)).astype(np.int32),
            logprobs=np.full(int(n), -12.0, np.float32),
            version=0,
        )
        for i, n in enumerate(lengths)
    ]
    adv = np.where(np.arange(rows) % 2 == 0, 1.0, -1.0).astype(np.float32)
    return Batch(
        rollouts=rollouts,
        group_index=np.arange(rows) // group,
        rewards=np.zeros(rows, np.float32),
        advantages=adv,
        ref_logprobs=None,
        staleness=np.zeros(rows, np.int64),
    )


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_gb(device) -> float:
    import torch

    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0


def time_publish(engine, dtype: str, repeats: int = 3) -> dict:
    """Seconds to pack the weights on the trainer's device as a cuda_ipc publish does (device copies
    included), from the engine's weight stream and from the whole-state default it replaced
    (full_state_dict: CPU copies, HF names over the whole dict)."""
    import torch

    from streamrl.train.engine_interface import TrainerEngine
    from streamrl.weights.cuda_ipc_publish import pack_stream

    streams = {"publish_stream_s": engine.weight_stream, "publish_whole_s": lambda: TrainerEngine.weight_stream(engine)}
    out = {}
    for key, stream in streams.items():
        times = []
        for _ in range(repeats):
            _sync(engine.device)
            t = time.perf_counter()
            packed = pack_stream(stream(), engine.device, getattr(torch, dtype))
            _sync(engine.device)
            times.append(time.perf_counter() - t)
            del packed
        out[key] = times
    return out


def time_checkpoints(engine, ckpt_dir: Path) -> dict:
    """A blocking save, then two background saves (their staging buffers allocated beforehand by
    Checkpointer.prepare, as the trainer does after its first step): the seconds each blocked the
    caller, the buffers' allocation off the caller's thread, and how long each write took."""
    import shutil

    from streamrl.train.checkpoint import Checkpointer

    out = {}
    try:
        sync = Checkpointer(ckpt_dir, keep=1, background=False)
        _sync(engine.device)
        out["checkpoint_sync_stall_s"] = sync.start(engine, 1, {}).stall_s
        sync.close()
        ckpt = Checkpointer(ckpt_dir, keep=1)
        ckpt.prepare(engine)
        ckpt.prepared()
        out["checkpoint_prepare_s"] = ckpt.prepare_s
        stalls, writes = [], []
        for version in (2, 3):
            _sync(engine.device)
            pending = ckpt.start(engine, version, {})
            stalls.append(pending.stall_s)
            t = time.perf_counter()
            pending.finalize()
            writes.append(pending.stall_s + time.perf_counter() - t)
        ckpt.close()
        out.update(checkpoint_async_stall_s=stalls, checkpoint_async_write_s=writes)
    finally:
        shutil.rmtree(ckpt_dir / "checkpoints", ignore_errors=True)
    return out


def profile_step(engine, batch, trace: Path) -> dict:
    """One train step under torch.profiler: its kernel time by category (bench/trainer_profile.py);
    the chrome trace goes to `trace` (gzipped: Perfetto and chrome://tracing open it as it is)."""
    import gzip
    import shutil

    from torch.profiler import ProfilerActivity, profile

    from bench.trainer_profile import breakdown

    device = engine.device.type
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        _sync(engine.device)
        t = time.perf_counter()
        engine.train_step(batch)
        _sync(engine.device)
        step_s = time.perf_counter() - t
    raw = trace.with_suffix("")  # the profiler writes plain JSON
    prof.export_chrome_trace(str(raw))
    with raw.open("rb") as src, gzip.open(trace, "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    return breakdown(prof.events(), step_s, device) | {"trace": str(trace)}


def _rank_main(
    cfg, batches, warmup: int, steps: int, out: str, ckpt_dir: str | None, publish: bool, profile: bool, rank, world
) -> None:
    import torch

    from streamrl.train.engines import make_engine

    t0 = time.perf_counter()
    engine = make_engine(cfg, cfg.model.path, rank, world)
    load_s = time.perf_counter() - t0
    if engine.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(engine.device)  # the step's peak (weights and AdamW state stay in it)
    times, m = [], {}
    if cfg.trainer.warm_up:
        from workers.trainer import warm_up

        warm_up(engine, cfg)
    from torch._dynamo.utils import counters

    graphs = []  # torch.compile's graphs so far, before each timed step and after the last
    try:
        for i in range(warmup + steps):
            if i >= warmup:
                graphs.append(counters["stats"]["unique_graphs"])
            _sync(engine.device)
            t = time.perf_counter()
            m = engine.train_step(batches[i % len(batches)])
            _sync(engine.device)
            if i >= warmup:
                times.append(time.perf_counter() - t)
        graphs.append(counters["stats"]["unique_graphs"])
    except torch.OutOfMemoryError as exc:
        Path(out).write_text(
            json.dumps({"oom": str(exc).splitlines()[0], "peak_gb": _peak_gb(engine.device), "load_s": load_s})
        )
        return
    result = {
        "step_s": times,
        "compiled_graphs": graphs[-1],
        "recompiles_in_timed_steps": graphs[-1] - graphs[0],
        "load_s": load_s,
        "peak_gb": _peak_gb(engine.device),
        "grad_norm": m["grad_norm"],
        "skipped": m["skipped_step"],
        "input_tokens": m["input_tokens"],
        "padded_tokens": m["padded_tokens"],
        **{k: getattr(cfg.trainer, k) for k in ("micro_batch_size", "micro_batch_tokens", "logprob_chunk_tokens")},
    }
    if profile:
        trace = Path(out).with_name(Path(out).stem + "_trace.json.gz")
        try:
            result["profile"] = profile_step(engine, batches[(warmup + steps) % len(batches)], trace)
        except Exception as exc:  # the timed steps stand without their breakdown
            result["profile_error"] = repr(exc)
    if publish:
        result.update(time_publish(engine, cfg.model.dtype))
    if ckpt_dir is not None:
        result.update(time_checkpoints(engine, Path(ckpt_dir)))
    Path(out).write_text(json.dumps(result))


def _variant_main(cfg, variant: str, batches, args, out: str, ckpt_dir: str | None) -> None:
    """One variant in a fresh process (its own CUDA context, compile caches and memory)."""
    from bench.trainer_variants import apply_variant
    from streamrl.train.dist import launch

    apply_variant(cfg, variant)
    main = _rank_main, cfg, batches, args.warmup, args.steps, out, ckpt_dir, args.publish, args.profile
    launch(1, functools.partial(*main))


def run(args) -> int:
    from streamrl.config.args import prepare_out_dir

    out_dir = prepare_out_dir(args.out)  # before the run: a bad --out must not cost a whole run
    with tempfile.TemporaryDirectory(prefix="streamrl-trainer-mfu-") as scratch:
        # Without --out the per-variant files are scratch (never the working directory).
        return _measure(args, out_dir or Path(scratch))


def _measure(args, out_dir: Path) -> int:
    import torch

    from streamrl.config.files import load_config
    from streamrl.models.shapes import build_random_model

    overrides = list(args.overrides) + ([f"trainer.device={args.device}"] if args.device else [])
    cfg = load_config(args.config, overrides)
    dtype = cfg.model.dtype if (args.device or cfg.trainer.device) != "cpu" else "float32"
    cfg.model.dtype = dtype
    cfg.trainer.warm_up = args.job_warm_up
    if args.job_warm_up:
        cfg.generator.max_tokens = args.completion_len
        longest = args.prompt_len + args.prompt_jitter + args.completion_len
        cfg.generator.max_model_len = max(cfg.generator.max_model_len, longest)
    model = Path(cfg.model.path or f"runs/models/{args.shape}-random")
    cfg.model.path = str(
        build_random_model(args.shape, model, dtype) if not (model / "config.json").exists() else model
    )
    hf = json.loads((Path(cfg.model.path) / "config.json").read_text())
    # With a prompt jitter every step (and the profiled one) gets its own batch, else all share one.
    count = args.warmup + args.steps + 1 if args.prompt_jitter else 1
    batches = [
        make_batch(
            args.rows,
            args.prompt_len,
            args.completion_len,
            hf["vocab_size"],
            seed=i,
            ragged=args.ragged,
            prompt_jitter=args.prompt_jitter,
        )
        for i in range(count)
    ]
    timed = [batches[i % count] for i in range(args.warmup, args.warmup + args.steps)]
    tokens = sum(len(r.prompt_ids) + len(r.completion_ids) for b in timed for r in b.rollouts) / len(timed)
    seq = tokens / args.rows  # mean row length (the attention term of the FLOPs)
    fpt = flops_per_token(hf, seq)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    peak = args.peak_tflops or next((v for k, v in PEAK_BF16_TFLOPS.items() if k in gpu), None)
    print(
        f"{gpu}: {Path(cfg.model.path).name} {dtype}, {args.rows} rows x {seq:.0f} tokens{' (ragged)' * args.ragged}"
        f"{f' (prompts +0..{args.prompt_jitter})' * bool(args.prompt_jitter)},"
        f" micro-batch {cfg.trainer.micro_batch_size}, {fpt / 1e9:.2f} GFLOP/token, peak {peak} TFLOP/s",
        flush=True,
    )
    results = {}
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="trainer_mfu_ckpt_", dir=args.checkpoint_dir) as tmp:
        for variant in args.variants.split(","):
            name = variant.replace("+", "_").replace("=", "")
            out = out_dir / f"trainer_mfu_{name}.json"
            out.unlink(missing_ok=True)  # a failed variant must not report an earlier run's file
            ckpt_dir = str(Path(tmp) / name) if args.checkpoint else None
            proc = ctx.Process(
                target=_variant_main,
                args=(cfg.model_copy(deep=True), variant, batches, args, str(out), ckpt_dir),
            )
            proc.start()
            proc.join()
            results[variant] = _report(variant, proc.exitcode, out, tokens, fpt, peak)
    if args.out:
        Path(args.out, "result.json").write_text(
            json.dumps(
                {
                    "gpu": gpu,
                    "tokens_per_step": tokens,
                    "flops_per_token": fpt,
                    "peak_tflops": peak,
                    "micro_batch_size": cfg.trainer.micro_batch_size,
                    "rows": args.rows,
                    "ragged": args.ragged,
                    "prompt_jitter": args.prompt_jitter,
                    "results": results,
                },
                indent=2,
            )
        )
    return 0 if all("error" not in r for r in results.values()) else 1


def _report(variant: str, exitcode: int | None, out: Path, tokens: int, fpt: float, peak: float | None) -> dict:
    """One variant's printed line and result (an OOM is a result, a crash an error)."""
    if exitcode != 0 or not out.exists():
        print(f"{variant:>22}: FAILED (exit code {exitcode})", flush=True)
        return {"error": f"exit code {exitcode}"}
    r = json.loads(out.read_text())
    if "oom" in r:
        print(f"{variant:>22}: OUT OF MEMORY at {r['peak_gb']:.1f} GiB peak ({r['oom']})", flush=True)
        return r
    step = sorted(r["step_s"])[len(r["step_s"]) // 2]  # median
    tps = tokens / step
    r.update(
        median_step_s=step,
        tokens_per_s=tps,
        mfu=(tps * fpt / (peak * 1e12)) if peak else None,
        pad_frac=1.0 - r["input_tokens"] / r["padded_tokens"],
    )
    mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
    print(
        f"{variant:>22}: step {step:.3f}s  {tps:,.0f} tok/s  MFU {mfu}  peak mem {r['peak_gb']:.1f} GiB  "
        f"padding {100 * r['pad_frac']:.0f}%  (load {r['load_s']:.0f}s, grad_norm {r['grad_norm']:.3g}, "
        f"{r['compiled_graphs']} compiled graphs, {r['recompiles_in_timed_steps']} in the timed steps)",
        flush=True,
    )
    if "profile" in r:
        from bench.trainer_profile import table

        print(f"{'':>22}  profiled step ({r['profile']['trace']}):\n" + table(r["profile"]), flush=True)
    if "profile_error" in r:
        print(f"{'':>22}  profile failed: {r['profile_error']}", flush=True)
    if "publish_stream_s" in r:
        print(
            f"{'':>22}  publish (pack on the device): weight stream "
            + ", ".join(f"{s:.3f}s" for s in r["publish_stream_s"])
            + "; whole state "
            + ", ".join(f"{s:.3f}s" for s in r["publish_whole_s"]),
            flush=True,
        )
    if "checkpoint_sync_stall_s" in r:
        print(
            f"{'':>22}  checkpoint: blocking save {r['checkpoint_sync_stall_s']:.2f}s; staging buffers "
            f"{r['checkpoint_prepare_s']:.2f}s off the training thread; background save stalls "
            + ", ".join(f"{s:.2f}s" for s in r["checkpoint_async_stall_s"])
            + " (writes "
            + ", ".join(f"{w:.2f}s" for w in r["checkpoint_async_write_s"])
            + ")",
            flush=True,
        )
    return r


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.trainer_mfu", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write DIR/result.json here")
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
