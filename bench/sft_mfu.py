"""SFT step throughput and MFU with packing, hf vs torchtitan backend, on a Qwen3-shaped model with
random weights and synthetic prompt/completion documents of mixed lengths.

Each backend runs in its own process: workers.sft.SFTRun (the engine, data, packing and loss of
`streamrl sft`) takes `--warmup` + `--steps` optimizer steps on one rank; the numbers are the
medians over the timed steps of what the run writes to metrics.jsonl: tokens/s counts every token
of the step (all packed, no padding) and MFU uses streamrl.train.flops (bench/trainer_mfu's
convention, attention per document).

    python -m bench.sft_mfu --config configs/qwen3-1.7b-sft-gpu.yaml --variants hf,torchtitan     # GPU
    python -m bench.sft_mfu --shape qwen3-tiny --device cpu --rows 64 --min-len 16 --max-len 64 \\
        --set sft.micro_batch_tokens=256 --set sft.max_seq_len=64 --set sft.batch_size=8
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing as mp
import random
import sys
from pathlib import Path

HELP = "SFT step tokens/s and MFU with packing, hf and torchtitan backends"


def add_arguments(p) -> None:
    p.add_argument("--config", default="configs/qwen3-1.7b-sft-gpu.yaml")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="config override a.b=c")
    p.add_argument(
        "--shape", default="qwen3-1.7b", help="streamrl.models.shapes shape built when model.path is missing"
    )
    p.add_argument("--device", default=None, help="trainer.device override (cpu for the smoke run)")
    p.add_argument("--variants", default="hf,torchtitan", help="comma list of BACKEND[+compile][+ac]")
    p.add_argument("--rows", type=int, default=2048, help="synthetic documents written")
    p.add_argument("--min-len", type=int, default=128, help="shortest document (tokens = characters)")
    p.add_argument("--max-len", type=int, default=4096, help="longest document")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)


def write_documents(path: Path, rows: int, min_len: int, max_len: int, seed: int = 0) -> None:
    """Prompt/completion pairs of uniformly random total length; a quarter of each is prompt."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz "
    with path.open("w") as fh:
        for _ in range(rows):
            n = rng.randint(min_len, max_len - 1)  # + EOS
            p = max(1, n // 4)
            text = "".join(rng.choices(letters, k=n))
            fh.write(json.dumps({"prompt": text[:p], "completion": text[p:]}) + "\n")


def _rank_main(cfg, warmup: int, steps: int, out: str, rank: int, world: int) -> None:
    import torch

    from workers.sft import SFTRun

    run = SFTRun(cfg, Path(out).parent, rank, world)
    rows = [run.step(i) for i in range(warmup + steps)]
    peak_gb = torch.cuda.max_memory_allocated(run.engine.device) / 2**30 if run.engine.device.type == "cuda" else 0.0
    if rank == 0:
        Path(out).write_text(json.dumps({"rows": rows[warmup:], "peak_gb": peak_gb}))


def _variant_main(cfg, variant: str, warmup: int, steps: int, out: str) -> None:
    from streamrl.train.dist import launch

    parts = variant.split("+")
    cfg.trainer.backend = parts[0]
    cfg.trainer.parallelism.compile = "compile" in parts
    cfg.trainer.activation_checkpointing = "ac" in parts
    launch(cfg.trainer.world_size, functools.partial(_rank_main, cfg, warmup, steps, out))


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def run(args) -> int:
    import torch

    from streamrl.config.files import load_config
    from streamrl.models.shapes import build_random_model

    out_dir = Path(args.out or "runs/bench-sft")
    out_dir.mkdir(parents=True, exist_ok=True)
    data = out_dir / "documents.jsonl"
    write_documents(data, args.rows, args.min_len, args.max_len)
    overrides = list(args.overrides) + [f"sft.data={data}"] + ([f"trainer.device={args.device}"] if args.device else [])
    cfg = load_config(args.config, overrides)
    if (args.device or cfg.trainer.device) == "cpu":
        cfg.model.dtype = "float32"
    model = Path(cfg.model.path or f"runs/models/{args.shape}-random")
    cfg.model.path = str(
        build_random_model(args.shape, model, cfg.model.dtype) if not (model / "config.json").exists() else model
    )
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    s = cfg.sft
    print(
        f"{gpu}: {Path(cfg.model.path).name} {cfg.model.dtype}, {s.batch_size} documents/step of {args.min_len}-"
        f"{args.max_len} tokens, packed into {s.micro_batch_tokens}-token rows, {cfg.trainer.world_size} rank(s)",
        flush=True,
    )
    results = {}
    ctx = mp.get_context("spawn")
    for variant in args.variants.split(","):
        out = out_dir / f"sft_mfu_{variant.replace('+', '_')}.json"
        out.unlink(missing_ok=True)
        proc = ctx.Process(
            target=_variant_main, args=(cfg.model_copy(deep=True), variant, args.warmup, args.steps, str(out))
        )
        proc.start()
        proc.join()
        if proc.exitcode != 0 or not out.exists():
            print(f"{variant:>22}: FAILED (exit code {proc.exitcode})", flush=True)
            results[variant] = {"error": f"exit code {proc.exitcode}"}
            continue
        r = json.loads(out.read_text())
        rows = r["rows"]
        summary = {
            "tokens_per_s": _median([x["tokens_per_s"] for x in rows]),
            "step_s": _median([x["train_s"] for x in rows]),
            "mfu": _median([x["mfu"] for x in rows]) if all("mfu" in x for x in rows) else None,
            "tokens_per_step": _median([x["seq_tokens"] for x in rows]),
            "padding_frac": max(x["padding_frac"] for x in rows),
            "peak_gb": r["peak_gb"],
            "loss": [x["loss"] for x in rows],
        }
        results[variant] = summary
        mfu = f"{100 * summary['mfu']:.1f}%" if summary["mfu"] is not None else "n/a"
        print(
            f"{variant:>22}: step {summary['step_s']:.3f}s  {summary['tokens_per_s']:,.0f} tok/s  MFU {mfu}  "
            f"{summary['tokens_per_step']:,.0f} tokens/step  padding {summary['padding_frac']:.1%}  "
            f"peak mem {summary['peak_gb']:.1f} GiB",
            flush=True,
        )
    (out_dir / "result.json").write_text(
        json.dumps({"gpu": gpu, "config": cfg.model_dump(mode="json"), "results": results}, indent=2)
    )
    return 0 if all("error" not in r for r in results.values()) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sft_mfu", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write DIR/result.json here (default runs/bench-sft)")
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
