"""`streamrl sft`'s training loop: supervised fine-tuning on the RL trainer's engines and checkpoints.

    streamrl sft --config configs/tiny-sft-cpu.yaml --run-dir runs/sft
    main(cfg, run_dir, resume=False)        # launches cfg.trainer.world_size ranks (streamrl/train/dist.py)

Every rank builds the engine (trainer.backend: hf or torchtitan, FSDP2), reads the data
(streamrl/sft/data.py) and trains its share of each step's rows (streamrl/sft/pack.py,
streamrl/sft/step.py). Step s trains the rows streamrl.sft.data.step_indices(s) names, so a
checkpoint (streamrl/train/checkpoint.py: model, optimizer, lr schedule, RNG; meta.json: the step and
data position) resumes exactly. Rank 0 writes metrics.jsonl (and the metric sinks) and prints a
progress line per step.
"""

from __future__ import annotations

import signal
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import structlog
import torch
import torch.distributed as dist

from streamrl.config.schema import Config
from streamrl.models.document_attention import enable_document_attention
from streamrl.sft.data import SampleError, load_splits, step_indices, tokenize_row
from streamrl.sft.step import sft_eval_loss, sft_train_step
from streamrl.train.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    truncate_metrics,
)
from streamrl.train.dist import broadcast_object, launch
from streamrl.train.engines import make_engine
from streamrl.train.flops import flops_coefficients, peak_flops
from streamrl.train.metrics import MetricsWriter

log = structlog.get_logger("streamrl").bind(role="sft")


class SFTRun:
    """One rank's view of the run: engine, tokenizer, data, counters."""

    def __init__(self, cfg: Config, run_dir: Path, rank: int, world: int):
        from transformers import AutoConfig, AutoTokenizer

        self.cfg, self.run_dir, self.rank = cfg, run_dir, rank
        self.engine = make_engine(cfg, cfg.model.path, rank, world)
        enable_document_attention(self.engine)
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
        self.train_rows, eval_rows = load_splits(cfg.sft, cfg.task, cfg.run.seed, cfg.generator.max_tokens)
        self.counts = {"skipped_rows": 0, "truncated_rows": 0}
        self.first_error: str | None = None
        eval_idx = list(range(min(len(eval_rows), cfg.sft.eval_max_samples)))
        self.eval_samples = self._samples(eval_rows, eval_idx[self.engine.dp_rank :: self.engine.dp_size])
        self.flops = flops_coefficients(AutoConfig.from_pretrained(cfg.model.path).to_dict())

    def _samples(self, rows, indices: list[int]):
        out = []
        for i in indices:
            try:
                sample = tokenize_row(self.tokenizer, rows[i], self.cfg.sft)
            except (SampleError, ValueError, TypeError) as exc:  # bad rows are counted, never fatal
                self.counts["skipped_rows"] += 1
                if self.first_error is None:
                    self.first_error = f"row {i}: {exc}"
                    log.warning("sft_row_skipped", row=i, error=str(exc))
                continue
            self.counts["truncated_rows"] += int(sample.truncated)
            out.append(sample)
        return out

    def step(self, step: int) -> dict:
        sft, e = self.cfg.sft, self.engine
        idx = step_indices(len(self.train_rows), step, sft.batch_size, self.cfg.run.seed)
        m = sft_train_step(e, self._samples(self.train_rows, idx[e.dp_rank :: e.dp_size]))
        a, b = self.flops
        flops = a * m["seq_tokens"] + b * m["attn_sq_tokens"]
        m["tokens_per_s"] = m["seq_tokens"] / max(1e-9, m["train_s"])
        peak = peak_flops(torch.cuda.get_device_name(e.device) if e.device.type == "cuda" else "")
        if peak:
            m["mfu"] = flops / m["train_s"] / (e.world_size * peak)
        return m


STOP_FILE = ".stop-requested"
"""Touched in RUN_DIR by the first SIGINT/SIGTERM: every rank stops after the step in progress."""


@contextmanager
def stop_on_signal(run_dir: Path):
    """First SIGINT/SIGTERM: ask for a stop at the next step boundary (checkpoint, then exit); the
    handler then reverts to the default, so a second signal kills at once."""

    def handler(signum, _frame):
        (run_dir / STOP_FILE).touch()
        signal.signal(signum, signal.SIG_DFL)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _rank_main(cfg: Config, run_dir: Path, resume: bool, rank: int, world: int) -> None:
    # Spawned ranks are fresh interpreters; a terminal's Ctrl-C reaches them too.
    with stop_on_signal(run_dir):
        _train(cfg, run_dir, resume, rank, world)


def _train(cfg: Config, run_dir: Path, resume: bool, rank: int, world: int) -> None:
    run = SFTRun(cfg, run_dir, rank, world)
    tc = cfg.trainer
    start = 0
    newest = latest_checkpoint(run_dir) if rank == 0 and resume else None
    path = broadcast_object(str(newest) if newest else None)  # every rank loads the one rank 0 picked
    if path:
        start = int(load_checkpoint(run.engine, Path(path))["version"])
    metrics = MetricsWriter(run_dir, cfg) if rank == 0 else MetricsWriter(None)
    if rank == 0:
        truncate_metrics(run_dir, start)
        if path:
            print(f"resumed from {path} (step {start})", flush=True)
    t0 = time.time()
    try:
        for step in range(start, tc.steps):
            m = run.step(step)
            done = step + 1
            rec = {
                "step": done,
                **m,
                "time_s": round(time.time() - t0, 3),
                "epoch": done * cfg.sft.batch_size / len(run.train_rows),
            }
            if (done % cfg.sft.eval_every == 0 or done == tc.steps) and _has_eval(run):
                rec["eval_loss"] = sft_eval_loss(run.engine, run.eval_samples)
            counts, stop = _counts(run, (run_dir / STOP_FILE).exists())
            rec.update(counts)
            metrics.write(rec)
            if rank == 0:
                print(progress_line(rec, tc.steps), flush=True)
            if done % tc.checkpoint_every == 0 or done == tc.steps or stop:
                meta = {"kind": "sft", "step": done, "data_position": done * cfg.sft.batch_size}
                save_checkpoint(run.engine, run_dir, done, meta, tc.checkpoint_keep)
            if stop:
                if rank == 0:
                    print(
                        f"stopped after step {done} (checkpoint saved); continue with: streamrl sft --resume {run_dir}",
                        flush=True,
                    )
                break
    finally:
        metrics.close()


def _has_eval(run: SFTRun) -> bool:
    """Whether any rank holds eval samples (collective, so every rank takes the same branch)."""
    n = torch.tensor([len(run.eval_samples)], dtype=torch.int64, device=run.engine.device)
    dist.all_reduce(n)
    return int(n.item()) > 0


def _counts(run: SFTRun, stop: bool) -> tuple[dict, bool]:
    """Row counters summed over ranks, and whether any rank saw a stop request (one collective)."""
    buf = torch.tensor(
        [run.counts["skipped_rows"], run.counts["truncated_rows"], int(stop)],
        dtype=torch.int64,
        device=run.engine.device,
    )
    dist.all_reduce(buf)
    return {"skipped_rows": int(buf[0]), "truncated_rows": int(buf[1])}, bool(buf[2])


def progress_line(rec: dict, steps: int) -> str:
    parts = [f"sft step {rec['step']:>4}/{steps}", f"loss {rec['loss']:.4f}"]
    if "eval_loss" in rec:
        parts.append(f"eval {rec['eval_loss']:.4f}")
    parts += [f"{rec['loss_tokens']:.0f} loss tokens", f"{rec['tokens_per_s']:,.0f} tok/s"]
    if "mfu" in rec:
        parts.append(f"MFU {100 * rec['mfu']:.1f}%")
    parts += [f"lr {rec['lr']:.2e}", f"t={rec['time_s']:.0f}s"]
    if rec.get("skipped_rows"):
        parts.append(f"skipped rows {rec['skipped_rows']}")
    return " | ".join(parts)


def main(cfg: Config, run_dir: Path, resume: bool = False) -> bool:
    """Train (or continue) the run; True if it reached trainer.steps, False if a signal stopped it."""
    run_dir = Path(run_dir)
    (run_dir / STOP_FILE).unlink(missing_ok=True)
    # The launching process: with one rank, and before and after spawned ranks run (while they run,
    # streamrl/train/dist.py passes a stop signal to rank 0, whose own handler touches the stop file).
    with stop_on_signal(run_dir):
        launch(cfg.trainer.world_size, partial(_rank_main, cfg, run_dir, resume))
    (run_dir / STOP_FILE).unlink(missing_ok=True)
    found = list_checkpoints(run_dir)  # a stop asked for during the last step still finished the run
    return bool(found) and max(found) >= cfg.trainer.steps
