"""One TRL `GRPOTrainer` job for `streamrl bench peers`, in its own interpreter (so its GPU memory is
freed before the next job). Not a `streamrl bench` entry itself: bench/peers.py runs it as

    python -m bench.peers_trl --model DIR --steps 10 --variant default --out OUT/trl-default.json

The workload is streamrl's shipped GPU job: the charclass task (prompt "digits:" etc., reward = the
share of the first `max_tokens` characters in the class), `completions` completions of exactly
`max_tokens` tokens (ignore_eos) per optimizer step in groups of `group`, no KL, bf16, vLLM colocated
on the training GPU. Variants:

- default: TRL's own defaults for what the workload leaves open (gradient checkpointing on, fp32
  master weights under bf16 autocast, the importance-correction forward over every generated batch);
- matched: streamrl's choices (no gradient checkpointing, bf16 weights, no importance-correction forward);
- offpolicy: matched, and one generation feeds two optimizer steps (`steps_per_generation` = 2 x the
  accumulation steps): TRL's one-GPU off-policy mode, the nearest to streamrl's max_staleness 1.

It writes one JSON: time to step 1 (from `--launched`, the parent's clock when it started this
process), each optimizer step's end time and completion tokens, and the settings used.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

VARIANTS = ("default", "matched", "offpolicy")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a Hugging Face model folder (the streamrl job's model.path)")
    p.add_argument("--variant", choices=VARIANTS, default="default")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps")
    p.add_argument("--completions", type=int, default=128, help="completions per optimizer step")
    p.add_argument("--group", type=int, default=8, help="completions per prompt")
    p.add_argument("--max-tokens", type=int, default=256, help="tokens per completion (ignore_eos)")
    p.add_argument("--micro-batch", type=int, default=64, help="completions per forward/backward")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.3, help="vLLM's share of the GPU")
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--no-vllm", action="store_true", help="generate with transformers (a CPU smoke run)")
    p.add_argument("--launched", type=float, default=None, help="the parent's time.time() when it started us")
    p.add_argument("--out", required=True, help="write the result JSON here")
    return p.parse_args(argv)


def trl_config(args, out_dir: Path):
    """The GRPOConfig of one variant; returns (config, the settings worth printing)."""
    import torch
    from trl import GRPOConfig

    if args.completions % args.micro_batch:
        raise SystemExit(f"--completions {args.completions} must be a multiple of --micro-batch {args.micro_batch}")
    accum = args.completions // args.micro_batch
    matched = args.variant in ("matched", "offpolicy")
    settings = {
        "per_device_train_batch_size": args.micro_batch,
        "gradient_accumulation_steps": accum,
        "steps_per_generation": accum * (2 if args.variant == "offpolicy" else 1),
        "num_generations": args.group,
        "max_completion_length": args.max_tokens,
        "beta": 0.0,
        "learning_rate": args.lr,
        "bf16": True,
        "gradient_checkpointing": not matched,
        "vllm_importance_sampling_correction": not matched,
    }
    cfg = GRPOConfig(
        output_dir=str(out_dir),
        max_steps=args.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
        use_vllm=not args.no_vllm,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=args.gpu_memory_utilization,
        vllm_max_model_length=args.max_model_len,
        generation_kwargs={"ignore_eos": True} if not args.no_vllm else {"min_new_tokens": args.max_tokens},
        # bf16 weights (streamrl's trainer) or TRL's default fp32 master weights under bf16 autocast
        model_init_kwargs={"dtype": torch.bfloat16} if matched else None,
        use_cpu=args.no_vllm and not torch.cuda.is_available(),
        **settings,
    )
    settings["master_weights"] = "bf16" if matched else "fp32"
    return cfg, settings


def main(argv=None) -> int:
    args = parse(argv)
    launched = args.launched or time.time()
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from streamrl.tasks.charclass import charclass_items, charclass_reward

    prompts_per_gen = args.completions // args.group * (2 if args.variant == "offpolicy" else 1)
    items = charclass_items(prompts_per_gen * (args.steps + 2), args.max_tokens, seed=0)
    data = Dataset.from_list([{"prompt": it["text"], "chars": it["meta"]["chars"]} for it in items])

    def charclass(prompts, completions, chars, **_):
        meta = [{"chars": c, "length": args.max_tokens} for c in chars]
        return [charclass_reward(p, c, m) for p, c, m in zip(prompts, completions, meta)]

    steps: list[dict] = []

    class Clock(TrainerCallback):
        """Each optimizer step's end time and its completion tokens (TRL logs the mean length per step)."""

        def on_step_end(self, a, state, control, **kw):
            steps.append({"step": state.global_step, "t": time.time() - launched})

        def on_log(self, a, state, control, logs=None, **kw):
            # A step that generated logs its completions' mean length; one that trains on an earlier
            # generation (the off-policy variant's second step) trains as many completions of that length.
            if logs and "completions/mean_length" in logs:
                self.mean_length = logs["completions/mean_length"]
            if steps and self.mean_length is not None and "tokens" not in steps[-1]:
                steps[-1]["tokens"] = round(self.mean_length * args.completions)

        mean_length: float | None = None

    out = Path(args.out)
    cfg, settings = trl_config(args, out.parent / f"trl-{args.variant}")
    trainer = GRPOTrainer(model=args.model, reward_funcs=charclass, args=cfg, train_dataset=data, callbacks=[Clock()])
    t_built = time.time() - launched
    trainer.train()
    out.write_text(
        json.dumps(
            {"variant": args.variant, "settings": settings, "built_s": round(t_built, 1), "steps": steps}, indent=1
        )
    )
    print(f"trl {args.variant}: {len(steps)} steps; step 1 at {steps[0]['t']:.1f} s" if steps else "trl: no steps")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
