"""The training step both trainer engines share (streamrl/train/hf_engine.py, streamrl/train/titan_engine.py):
AdamW and the lr schedule, the configured loss over each rank's micro-batches, gradient clipping, one
optimizer step per batch, metrics summed over data-parallel ranks. A backend builds its model (`_build`)
and computes its log-probs (`logprobs`); the rest of streamrl.train.engine_interface.TrainerEngine it
implements itself (full_state_dict, weight_stream: the weights' names differ). With reference.source=trainer
(trainer.lora) the step also computes the KL term's reference log-probs, a no-grad forward of the same
model inside the backend's `reference_mode()` (the adapter disabled), before each micro-batch's own.

    class MyEngine(StepEngine):
        def _build(self, model_path): ...                     # sets model, pad_id, vocab_size
        def logprobs(self, padded, with_entropy=False): ...   # [B, T] log-probs of the completion tokens
"""

from __future__ import annotations

import math
import time
from abc import abstractmethod
from collections import defaultdict
from contextlib import AbstractContextManager
from functools import partial

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from streamrl.config.schema import Config
from streamrl.core.batch import Batch, no_loss_tokens
from streamrl.core.errors import ConfigError, StreamRLError
from streamrl.losses import LossInputs, compute_loss, loss_requirements, resolve_loss
from streamrl.models.hf import pick_device
from streamrl.train.batching import pad_batch, plan_micro_batches
from streamrl.train.engine_interface import TrainerEngine
from streamrl.train.mismatch import MismatchMeter, mismatch_metrics


def lr_factor(tc, step: int) -> float:
    """Multiplier of trainer.lr before optimizer step `step` (0-based): warm-up, then the decay."""
    if step < tc.warmup_steps:
        return (step + 1) / (tc.warmup_steps + 1)
    span = max(1, tc.steps - tc.warmup_steps - 1)
    t = min(1.0, (step - tc.warmup_steps) / span)
    if tc.lr_schedule == "linear":
        return 1.0 - (1.0 - tc.min_lr_ratio) * t
    if tc.lr_schedule == "cosine":
        return tc.min_lr_ratio + (1.0 - tc.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * t))
    return 1.0


def check_launch(engine: str, world_size: int, model_path: str | None) -> None:
    """What every engine needs before it loads: a process group of world_size ranks and a model folder."""
    if not dist.is_initialized() or dist.get_world_size() != world_size:
        raise StreamRLError(
            f"{engine} needs a torch.distributed group of {world_size} ranks; "
            "start the trainer through streamrl.train.dist.launch (or torchrun)"
        )
    if not model_path:
        raise ConfigError(
            f"{engine} got no model folder; pass streamrl.models.tiny.resolve_model_path(cfg.model, "
            "cache_dir, cfg.run.seed), which builds the tiny model when model.path is unset"
        )


def engine_device(choice: str) -> torch.device:
    """trainer.device resolved; on CUDA the rank's current device (set by streamrl.train.dist)."""
    device = pick_device(choice)
    return torch.device("cuda", torch.cuda.current_device()) if device.type == "cuda" else device


class StepEngine(TrainerEngine):
    """One rank's model + AdamW and the shared training step; every method is collective (all ranks call
    it in step). Subclasses build the model in `_build` and compute log-probs in `logprobs`."""

    def __init__(self, cfg: Config, model_path: str, rank: int, world_size: int):
        check_launch(type(self).__name__, world_size, model_path)
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        # Data-parallel coordinates: every rank is one data shard here (a tensor-parallel backend
        # gives the ranks of one TP group the same shard and reduces metrics over dp_group only).
        self.dp_rank, self.dp_size, self.dp_group = rank, world_size, None
        self.device = engine_device(cfg.trainer.device)
        torch.manual_seed(cfg.trainer.seed)
        self._build(model_path)
        self._init_optimizer()

    @abstractmethod
    def _build(self, model_path: str) -> None:
        """Load the model onto this rank and shard it: sets model, pad_id, vocab_size."""

    def _init_optimizer(self) -> None:
        """AdamW over self.model, the lr schedule, the loss's inputs; shared by every backend."""
        tc = self.cfg.trainer
        # Trainable parameters only: with trainer.lora the frozen base gets no optimizer state.
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=tc.lr, weight_decay=tc.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, partial(lr_factor, tc))
        self.loss = resolve_loss(self.cfg)
        self.requirements = loss_requirements(self.loss)
        self.reference_here = "ref_logprobs" in self.requirements and self.cfg.reference_in_trainer()
        """The step computes the reference log-probs itself (reference.source=trainer); a batch's are ignored."""
        self.steps_done = 0
        self._mismatch = MismatchMeter()

    @abstractmethod
    def logprobs(self, padded: dict[str, Tensor], with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        """Current-policy log-probs [B, T] of the completion tokens (graph kept for backward), and their
        entropy when asked."""

    def reference_mode(self) -> AbstractContextManager:
        """A block in which `logprobs` is the reference model's (reference.source=trainer)."""
        raise ConfigError(
            f"reference.source=trainer needs a trainer backend that trains a LoRA adapter it can disable; "
            f"{type(self).__name__} cannot: set reference.source=worker"
        )

    def reference_logprobs(self, padded: dict[str, Tensor]) -> Tensor:
        """[B, T] reference log-probs of one micro-batch (model_inputs' tensors on self.device), no graph:
        this engine's own model in reference_mode(), through the same `logprobs` as the policy's."""
        with torch.no_grad(), self.reference_mode():
            logp, _ = self.logprobs(padded)
        return logp.detach().float()

    def model_inputs(self, mb: Batch) -> dict[str, Tensor]:
        """The CPU tensors of one micro-batch that `logprobs` reads (pad_batch's)."""
        return pad_batch(mb, self.pad_id, self.cfg.trainer.seq_multiple())

    def _micro_step(self, mb: Batch, total_tokens: float, total_seqs: float) -> dict[str, float]:
        padded = {k: v.to(self.device) for k, v in self.model_inputs(mb).items()}
        if self.reference_here:
            # First, so the policy forward's FSDP gathers are the ones its backward follows.
            padded["ref_logprobs"] = self.reference_logprobs(padded)
        # Pad waste: input positions the forward computes vs those that hold a real token.
        sizes = {
            "input_tokens": float(sum(len(r.prompt_ids) + len(r.completion_ids) for r in mb.rollouts)),
            "padded_tokens": float(padded.get("packed_ids", padded["input_ids"]).numel()),
        }
        # Entropy is always logged (no gradient unless loss.entropy_coef > 0 asks for the bonus).
        want = True if "entropy" in self.requirements else ("metric" if self.cfg.trainer.log_entropy else False)
        logp, entropy = self.logprobs(padded, with_entropy=want)
        inp = LossInputs(
            logprobs=logp,
            old_logprobs=padded["old_logprobs"],
            advantages=padded["advantages"],
            mask=padded["mask"],
            ref_logprobs=padded.get("ref_logprobs"),
            # The weights before this step are the ones that just ran the forward (one optimizer
            # step per batch, dropout off), so the proximal policy is this forward, detached.
            prox_logprobs=logp.detach() if "prox_logprobs" in self.requirements else None,
            entropy=entropy,
            total_tokens=total_tokens,
            total_seqs=total_seqs,
            dp_world_size=self.dp_size,
        )
        loss, metrics = compute_loss(self.loss, inp)
        self._mismatch.add(logp, inp.old_logprobs, inp.mask, mb.staleness)
        loss.backward()
        return {**metrics, **sizes}

    def train_step(self, batch: Batch) -> dict[str, float]:
        """One optimizer step on the whole batch (every rank passes the same full batch)."""
        start = time.perf_counter()
        if len(batch) == 0:
            raise StreamRLError("train_step got an empty batch; the assembler must hand over complete groups")
        if "ref_logprobs" in self.requirements and batch.ref_logprobs is None and not self.reference_here:
            raise ConfigError(
                "the loss needs ref_logprobs but the batch has none; with loss.kl_beta > 0 and "
                "reference.source=worker the assembler must wait for the reference workers' annotation"
            )
        if batch.num_loss_tokens == 0:
            raise no_loss_tokens(batch, self.cfg.generator.max_tokens)
        total_tokens, total_seqs = float(batch.num_loss_tokens), float(len(batch))
        tc = self.cfg.trainer
        shard = batch.shard(self.dp_rank, self.dp_size)
        plan = plan_micro_batches(batch, self.dp_size, tc.micro_batch_size, tc.micro_batch_tokens)[self.dp_rank]
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = defaultdict(float)
        self._mismatch = MismatchMeter()
        for index in plan:
            for key, value in self._micro_step(shard.select(index), total_tokens, total_seqs).items():
                sums[key] += float(value)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.trainer.grad_clip)
        grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
        # A non-finite norm would turn every weight into NaN: skip the step, report it, keep going.
        skipped = not np.isfinite(grad_norm)
        if skipped:
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.optimizer.step()
            self.steps_done += 1
        self.scheduler.step()
        out = self._all_reduce(dict(sums), op=dist.ReduceOp.SUM, group=self.dp_group)
        mm_sums, mm_peaks = self._mismatch.local()
        mm_sums = self._all_reduce(mm_sums, op=dist.ReduceOp.SUM, group=self.dp_group)
        peaks = self._all_reduce({**mm_peaks, "time_s": time.perf_counter() - start}, op=dist.ReduceOp.MAX)
        out["time_s"] = peaks.pop("time_s")
        out.update(mismatch_metrics(mm_sums, peaks))
        out.update(
            grad_norm=grad_norm,
            lr=float(self.optimizer.param_groups[0]["lr"]),
            tokens=total_tokens,
            seqs=total_seqs,
            skipped_step=float(skipped),
        )
        return out

    def warm_up(self, lengths: tuple[int, ...]) -> None:
        """Forward + backward of one dummy micro-batch per length (micro_batch_size rows of that
        many tokens on every rank), gradients discarded: the first real step then does not also pay
        CUDA's kernel selection, the allocator's growth and torch.compile (without trainer.seq_bucket,
        two lengths: the static graph and the dynamic one its recompile makes). Weights, optimizer
        state, schedule and steps_done are untouched. Collective: every rank passes the same lengths."""
        from streamrl.core.messages import Rollout

        rows = self.cfg.trainer.micro_batch_size
        for length in lengths:
            completion = max(1, length - 1)
            rollouts = [
                Rollout(
                    rollout_id=f"warm-up:{i}",
                    group_id="warm-up",
                    sample=i,
                    group_size=rows,
                    prompt_ids=np.ones(1, np.int32),
                    completion_ids=np.ones(completion, np.int32),
                    logprobs=np.zeros(completion, np.float32),
                    version=0,
                )
                for i in range(rows)
            ]
            zeros = np.zeros(rows, np.float32)
            # reference.source=trainer: the warm-up runs the reference forward too, as every step does
            needs_ref = "ref_logprobs" in self.requirements and not self.reference_here
            ref = [np.zeros(completion, np.float32)] * rows if needs_ref else None
            batch = Batch(rollouts, np.zeros(rows, np.int64), zeros, zeros, ref, np.zeros(rows, np.int64))
            self._micro_step(batch, float(rows * completion), float(rows))
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _all_reduce(self, values: dict[str, float], op, group=None) -> dict[str, float]:
        keys = sorted(values)
        buf = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=self.device)
        dist.all_reduce(buf, op=op, group=group)
        return dict(zip(keys, buf.tolist()))
