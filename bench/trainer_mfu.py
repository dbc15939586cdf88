"""Trainer-step throughput and MFU, hf vs torchtitan backend, on a Qwen3-shaped model with random weights.

Each variant (a backend, optionally with compile / activation checkpointing) runs in its own
process: the real engine (workers.engines.make_engine) on one rank takes `--warmup` + `--steps`
full train steps on the same GRPO batch (rows of prompt + completion tokens, no padding), timed
with the device synchronized. tokens/s counts every token the step processes (prompt and
completion); MFU = tokens/s * FLOPs per token / the GPU's peak dense bf16 FLOP/s, with FLOPs per
token = 6 * (matmul parameters, lm_head included) + 12 * layers * heads * head_dim * seq_len
(torchtitan's convention: attention counted without the causal half).

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

HELP = "trainer step tokens/s and MFU for the hf and torchtitan backends"
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}
"""Datasheet dense bf16 peaks, matched against torch.cuda.get_device_name()."""


def add_arguments(p) -> None:
    p.add_argument("--config", default="configs/qwen3-1.7b-train.yaml")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="config override a.b=c")
    p.add_argument("--shape", default="qwen3-1.7b", help="streamrl.shapes shape built when model.path is missing")
    p.add_argument("--device", default=None, help="trainer.device override (cpu for the smoke run)")
    p.add_argument("--variants", default="hf,torchtitan",
                   help="comma list of BACKEND[+compile][+ac], e.g. hf,torchtitan,torchtitan+compile")
    p.add_argument("--rows", type=int, default=32, help="rollouts per batch (groups of 8)")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--completion-len", type=int, default=1536)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--peak-tflops", type=float, default=None, help="default: by GPU name (H100/H200 989)")


def flops_per_token(hf: dict, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward) of a dense decoder with config.json `hf`."""
    d, layers, heads = hf["hidden_size"], hf["num_hidden_layers"], hf["num_attention_heads"]
    hd = hf.get("head_dim") or d // heads
    kv = hf.get("num_key_value_heads") or heads
    attn = d * hd * (2 * heads + 2 * kv)  # q, o: heads*hd; k, v: kv*hd
    mlp = 3 * d * hf["intermediate_size"]
    matmul_params = layers * (attn + mlp) + d * hf["vocab_size"]  # lm_head is a matmul even when tied
    return 6.0 * matmul_params + 12.0 * layers * heads * hd * seq_len


def make_batch(rows: int, prompt_len: int, completion_len: int, vocab: int, seed: int = 0):
    import numpy as np

    from streamrl.batch import Batch
    from streamrl.messages import Rollout

    rng = np.random.default_rng(seed)
    group = 8 if rows % 8 == 0 else rows
    rollouts = [Rollout(rollout_id=f"g{i // group}:{i % group}", group_id=f"g{i // group}", sample=i % group,
                        group_size=group, prompt_ids=rng.integers(4, vocab, prompt_len).astype(np.int32),
                        completion_ids=rng.integers(4, vocab, completion_len).astype(np.int32),
                        logprobs=np.full(completion_len, -12.0, np.float32), version=0)
                for i in range(rows)]
    adv = np.where(np.arange(rows) % 2 == 0, 1.0, -1.0).astype(np.float32)
    return Batch(rollouts=rollouts, group_index=np.arange(rows) // group, rewards=np.zeros(rows, np.float32),
                 advantages=adv, ref_logprobs=None, staleness=np.zeros(rows, np.int64))


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rank_main(cfg, batch, warmup: int, steps: int, out: str, rank: int, world: int) -> None:
    import torch

    from workers.engines import make_engine

    t0 = time.perf_counter()
    engine = make_engine(cfg, cfg.model.path, rank, world)
    load_s = time.perf_counter() - t0
    times = []
    for i in range(warmup + steps):
        _sync(engine.device)
        t = time.perf_counter()
        m = engine.train_step(batch)
        _sync(engine.device)
        if i >= warmup:
            times.append(time.perf_counter() - t)
    peak_gb = torch.cuda.max_memory_allocated(engine.device) / 2**30 if engine.device.type == "cuda" else 0.0
    Path(out).write_text(json.dumps({"step_s": times, "load_s": load_s, "peak_gb": peak_gb,
                                     "grad_norm": m["grad_norm"], "skipped": m["skipped_step"]}))


def _variant_main(cfg, variant: str, batch, warmup: int, steps: int, out: str) -> None:
    """One variant in a fresh process (its own CUDA context, compile caches and memory)."""
    from workers.dist import launch

    parts = variant.split("+")
    cfg.trainer.backend = parts[0]
    cfg.trainer.parallelism.compile = "compile" in parts
    cfg.trainer.activation_checkpointing = "ac" in parts
    launch(1, functools.partial(_rank_main, cfg, batch, warmup, steps, out))


def run(args) -> int:
    from streamrl.commands.common import prepare_out_dir

    out_dir = prepare_out_dir(args.out)  # before the run: a bad --out must not cost a whole run
    with tempfile.TemporaryDirectory(prefix="streamrl-trainer-mfu-") as scratch:
        # Without --out the per-variant files are scratch (never the working directory).
        return _measure(args, out_dir or Path(scratch))


def _measure(args, out_dir: Path) -> int:
    import torch

    from streamrl.config_files import load_config
    from streamrl.shapes import build_random_model

    overrides = list(args.overrides) + ([f"trainer.device={args.device}"] if args.device else [])
    cfg = load_config(args.config, overrides)
    dtype = cfg.model.dtype if (args.device or cfg.trainer.device) != "cpu" else "float32"
    cfg.model.dtype = dtype
    model = Path(cfg.model.path or f"runs/models/{args.shape}-random")
    cfg.model.path = str(build_random_model(args.shape, model, dtype) if not (model / "config.json").exists() else model)
    hf = json.loads((Path(cfg.model.path) / "config.json").read_text())
    seq = args.prompt_len + args.completion_len
    batch = make_batch(args.rows, args.prompt_len, args.completion_len, hf["vocab_size"])
    tokens = args.rows * seq
    fpt = flops_per_token(hf, seq)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    peak = args.peak_tflops or next((v for k, v in PEAK_BF16_TFLOPS.items() if k in gpu), None)
    print(f"{gpu}: {Path(cfg.model.path).name} {dtype}, {args.rows} rows x {seq} tokens, micro-batch "
          f"{cfg.trainer.micro_batch_size}, {fpt / 1e9:.2f} GFLOP/token, peak {peak} TFLOP/s", flush=True)
    results = {}
    ctx = mp.get_context("spawn")
    for variant in args.variants.split(","):
        out = out_dir / f"trainer_mfu_{variant.replace('+', '_')}.json"
        out.unlink(missing_ok=True)  # a failed variant must not report an earlier run's file
        proc = ctx.Process(target=_variant_main, args=(cfg.model_copy(deep=True), variant, batch, args.warmup,
                                                        args.steps, str(out)))
        proc.start()
        proc.join()
        if proc.exitcode != 0 or not out.exists():
            print(f"{variant:>22}: FAILED (exit code {proc.exitcode})", flush=True)
            results[variant] = {"error": f"exit code {proc.exitcode}"}
            continue
        r = json.loads(out.read_text())
        step = sorted(r["step_s"])[len(r["step_s"]) // 2]  # median
        tps = tokens / step
        r.update(median_step_s=step, tokens_per_s=tps, mfu=(tps * fpt / (peak * 1e12)) if peak else None)
        results[variant] = r
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        print(f"{variant:>22}: step {step:.3f}s  {tps:,.0f} tok/s  MFU {mfu}  peak mem {r['peak_gb']:.1f} GiB  "
              f"(load {r['load_s']:.0f}s, grad_norm {r['grad_norm']:.3g})", flush=True)
    if args.out:
        Path(args.out, "result.json").write_text(json.dumps(
            {"gpu": gpu, "tokens_per_step": tokens, "flops_per_token": fpt, "peak_tflops": peak,
             "micro_batch_size": cfg.trainer.micro_batch_size, "results": results}, indent=2))
    return 0 if all("error" not in r for r in results.values()) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.trainer_mfu", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write DIR/result.json here")
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
