"""`streamrl plan`: the memory a job needs per GPU, and the layouts of a multi-GPU host that fit it,
computed from the model's config (streamrl/models/sizing.py), for the config's model or named shapes.

    streamrl plan --config configs/qwen3-8b-8gpu.yaml
    streamrl plan --models qwen3-1.7b,qwen3-8b,qwen3-32b --gpus 8 --gpu-gb 80

The KV cache a generator needs is its sequences at once (generator.max_num_seqs, else
max_inflight_groups x rollout.group_size) x generator.max_model_len tokens, or generator.kv_cache_memory_gb
where the config fixes it.
"""

from __future__ import annotations

import json
from pathlib import Path

from streamrl.config.args import add_config_args, load
from streamrl.core.errors import ConfigError

NAME = "plan"
HELP = "memory per GPU (weights, optimizer state, KV cache) and the GPU layouts that fit"
DESCRIPTION = (
    "Size a job from its model's config: weights, the trainer's sharded state, a generator's KV cache per "
    "GPU, and which splits of trainer ranks and tensor-parallel generators fit the host (nothing starts)."
)


def add_arguments(p) -> None:
    add_config_args(p)
    p.add_argument(
        "--models",
        help="comma-separated model shapes (streamrl/models/shapes.py) or Hugging Face folders; "
        "default: the config's model.path",
    )
    p.add_argument("--gpus", type=int, default=8, help="GPUs of the host (default 8)")
    p.add_argument("--gpu-gb", type=float, default=80.0, help="memory of one GPU in GB (default 80)")


def shape_of(name: str):
    """A ModelShape from a shape name or a folder holding config.json."""
    from streamrl.models.shapes import SHAPES
    from streamrl.models.sizing import ModelShape

    if name in SHAPES:
        return ModelShape.from_config(SHAPES[name])
    path = Path(name) / "config.json"
    random_of = Path(name).name.removesuffix("-random")
    if not path.is_file() and random_of in SHAPES:  # a GPU config's runs/models/<shape>-random, not built yet
        return ModelShape.from_config(SHAPES[random_of])
    if not path.is_file():
        raise ConfigError(
            f"{name!r} is neither a model shape ({', '.join(sorted(SHAPES))}) nor a folder with config.json"
        )
    return ModelShape.from_config(json.loads(path.read_text()))


def table(cfg, names: list[str], gpus: int, gpu_gb: float) -> str:
    from streamrl.models.sizing import GB, Plan

    g = cfg.generator
    seqs = g.max_num_seqs or g.max_inflight_groups * cfg.rollout.group_size
    lines = [
        f"host: {gpus} x {gpu_gb:g} GB; generator KV cache for {seqs} sequences x {g.max_model_len} tokens "
        f"(bf16); trainer: FSDP2, 16 bytes/parameter sharded (fp32 weights, grads, AdamW), "
        f"activations not counted",
        "",
        f"{'model':<12} {'params':>7} {'weights':>8} {'train/GPU at 1|4|8 ranks':>27} "
        f"{'KV/token':>9} {'KV/job':>8} {'gen/GPU at TP 1|2|4|8':>27}",
    ]
    fits = []
    for name in names:
        shape = shape_of(name)
        plan = Plan(shape, kv_tokens=seqs * g.max_model_len, gpus=gpus, gpu_gb=gpu_gb)
        train = " | ".join(f"{plan.trainer_gb(n):.0f}" for n in (1, 4, 8))
        gen = " | ".join(f"{sum(plan.generator_gb(tp)):.0f}" if shape.tp_fits_heads(tp) else "-" for tp in (1, 2, 4, 8))
        kv_job = plan.kv_tokens * shape.kv_bytes_per_token() / GB
        lines.append(
            f"{Path(name).name:<12} {shape.params / 1e9:>6.2f}B {plan.weights_gb:>6.1f}GB {train + ' GB':>27} "
            f"{shape.kv_bytes_per_token() / 1024:>7.0f}KB {kv_job:>6.1f}GB {gen + ' GB':>27}"
        )
        layouts = plan.layouts()
        if not layouts:
            fits.append(f"{Path(name).name}: no layout of {gpus} x {gpu_gb:g} GB fits; more GPUs (or hosts) needed")
            continue
        best = layouts[0]
        others = ", ".join(f"{lay.trainer_gpus}+{lay.generators}x{lay.tp}" for lay in layouts[1:6])
        fits.append(
            f"{Path(name).name}: trainer on {best.trainer_gpus} GPU(s) ({best.trainer_gb:.0f} GB each) + "
            f"{best.generators} generator(s) of TP={best.tp} ({best.generator_gb:.0f} GB per GPU)"
            + (f"; also fits (trainer+generators x TP): {others}" if others else "")
        )
    lines += ["", f"layouts that fit {gpus} x {gpu_gb:g} GB (most generator GPUs first):"] + [f"  {f}" for f in fits]
    return "\n".join(lines) + "\n"


def run(args) -> int:
    cfg = load(args)
    names = [n.strip() for n in args.models.split(",")] if args.models else [cfg.model.path] if cfg.model.path else []
    if not names:
        raise ConfigError("the config's model is the tiny one; name models to plan, e.g. --models qwen3-8b")
    print(table(cfg, names, args.gpus, args.gpu_gb), end="")
    return 0
