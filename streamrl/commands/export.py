"""`streamrl export`: a run's checkpoint (RL or SFT) as a Hugging Face model folder (streamrl/train/export.py)."""

from __future__ import annotations

from pathlib import Path

NAME = "export"
HELP = "write a Hugging Face model folder from a run's checkpoint"
DESCRIPTION = (
    "Convert RUN_DIR/checkpoints/step-N (the newest unless --step) of a `streamrl up` or `streamrl sft` "
    "run into a folder transformers and vLLM load: config, safetensors, tokenizer, generation config."
)


def add_arguments(p) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (holds config.yaml and checkpoints/)")
    p.add_argument("--step", type=int, help="checkpoint step to export (default: the newest)")
    p.add_argument("--out", required=True, help="output folder (replaced if it holds an earlier export)")


def run(args) -> int:
    from streamrl.train.export import export_checkpoint

    out = export_checkpoint(Path(args.run_dir), Path(args.out), args.step)
    print(f"exported {out}", flush=True)
    return 0
