"""`streamrl sft`: supervised fine-tuning on the RL trainer's engines; writes RUN_DIR/hf at the end.

streamrl sft --config configs/tiny-sft-cpu.yaml --run-dir runs/sft
streamrl up --set model.path=runs/sft/hf          # RL from the fine-tuned model
"""

from __future__ import annotations

import time
from pathlib import Path

from streamrl.config.args import add_config_args, load
from streamrl.config.files import dump_config
from streamrl.core.errors import ConfigError
from streamrl.core.progress_bars import quiet_progress_bars
from streamrl.models.tiny import resolve_model

NAME = "sft"
HELP = "supervised fine-tuning (chat messages or prompt/completion pairs) on the trainer's engines"
DESCRIPTION = (
    "Fine-tune model.path (or the tiny offline model) on sft.data with trainer.* (backend, world size, "
    "optimizer, steps, checkpoints); metrics in RUN_DIR/metrics.jsonl, the final Hugging Face "
    "model in RUN_DIR/hf."
)
DEFAULT = Path(__file__).resolve().parents[2] / "configs" / "tiny-sft-cpu.yaml"


def add_arguments(p) -> None:
    add_config_args(p)
    for action in p._actions:  # same flags as `up`, another default file
        if action.dest == "config":
            action.help = "YAML config (default: configs/tiny-sft-cpu.yaml)"
    p.add_argument("--run-dir", help="output folder (default: a new folder under runs/)")
    p.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue the SFT run in RUN_DIR from its newest checkpoint "
        "(its config plus --set): the same rows in the same order, as if it had never stopped",
    )


def run(args) -> int:
    quiet_progress_bars()  # before transformers is imported
    from transformers import AutoTokenizer

    from streamrl.sft.data import load_splits
    from streamrl.sft.trainable import check_first_rows
    from streamrl.train.checkpoint import list_checkpoints
    from streamrl.train.export import export_checkpoint
    from workers.sft import main

    if args.resume:
        if not (Path(args.resume) / "config.yaml").is_file():
            raise ConfigError(
                f"--resume {args.resume}: no config.yaml there; pass the run directory of an earlier `streamrl sft`"
            )
        args.config, args.run_dir = args.config or str(Path(args.resume) / "config.yaml"), args.resume
    args.config = args.config or str(DEFAULT)
    cfg = resolve_model(load(args))
    # A data error, or data with nothing to train on, stops here, before any rank starts.
    train_rows, _ = load_splits(cfg.sft, cfg.task, cfg.run.seed, cfg.generator.max_tokens)
    check_first_rows(AutoTokenizer.from_pretrained(cfg.model.path), train_rows, cfg.sft)
    run_dir = Path(args.run_dir or Path("runs") / f"sft-{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    if not args.resume and list_checkpoints(run_dir):
        raise ConfigError(
            f"{run_dir} already holds checkpoints of an earlier run; pass --resume {run_dir} to "
            "continue it, or choose a new --run-dir"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, run_dir / "config.yaml")
    print(
        f"streamrl sft: run '{cfg.run.name}' in {run_dir} ({cfg.trainer.backend} backend, "
        f"{cfg.trainer.world_size} rank(s), {cfg.trainer.steps} steps)",
        flush=True,
    )
    if not main(cfg, run_dir, resume=bool(args.resume)):
        return 130  # stopped by a signal after a checkpoint; the message says how to continue
    out = export_checkpoint(run_dir, run_dir / "hf")
    print(f"done: metrics in {run_dir / 'metrics.jsonl'}, model in {out}", flush=True)
    return 0
