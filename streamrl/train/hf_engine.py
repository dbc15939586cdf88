"""The trainer's compute engine: an FSDP2-sharded Hugging Face causal LM, log-prob recomputation,
the configured loss over micro-batches, one optimizer step per batch, and the full state dict.

Runs inside every torch.distributed rank of the trainer (see streamrl/train/dist.py):

    def rank_main(rank, world):
        engine = TrainEngine(cfg, model_path, rank, world)    # a streamrl.train.engine_interface.TrainerEngine
        batch = broadcast_object(batch_or_none_on_other_ranks)  # streamrl.train.dist
        metrics = engine.train_step(batch)          # identical on every rank
        state = engine.full_state_dict()            # HF names on rank 0, None elsewhere
    launch(cfg.trainer.world_size, rank_main)

Sharding: each decoder layer (the model's `_no_split_modules` classes) is one FSDP2 unit, then the
root (embeddings, final norm, lm_head). FSDP2 averages gradients over ranks; the loss library
pre-scales by dp_world_size and divides by the whole batch's token/sequence counts, so summing
micro-batch gradients here gives exactly the single-process full-batch gradient.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from functools import partial

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from streamrl.assemble.batch import Batch, no_loss_tokens
from streamrl.config.schema import Config
from streamrl.core.errors import ConfigError, StreamRLError
from streamrl.losses import LossInputs, compute_loss, loss_requirements, resolve_loss
from streamrl.models.hf import causal_lm_logprobs, check_plain_head, pack_completions, pick_device
from streamrl.train.engine_interface import TrainerEngine
from streamrl.train.mismatch import MismatchMeter, mismatch_metrics
from streamrl.weights.store import WeightStream, module_weight_stream


def pad_batch(batch: Batch, pad_id: int, multiple: int = 1) -> dict[str, Tensor]:
    """Right-padded tensors for one (micro-)batch of B rollouts; pure, CPU tensors.

    input_ids, attention_mask [B, L]: prompt + completion, L = longest prompt+completion rounded up
        to a multiple of `multiple` (trainer.seq_bucket); the extra columns are padding.
    positions [B, T]: index of the logit that predicts completion token t, i.e. len(prompt)+t-1;
        T = longest completion; padded entries point at 0 (any valid index; they are masked).
    targets [B, T] (the completion ids), mask [B, T] float (1 on real completion tokens, 0 on an
    episode's observation tokens),
    old_logprobs [B, T] (behaviour log-probs), advantages [B], lengths [B] (completion tokens per
    row), and ref_logprobs [B, T] when the batch carries them. An empty batch gives one fully
    masked row, so a rank with nothing to train on still runs the forward/backward that FSDP's
    collectives need on every rank.
    """
    rows = batch.rollouts
    if not rows:
        one = torch.zeros((1, 1), dtype=torch.long)
        out = {
            "input_ids": one + pad_id,
            "attention_mask": one + 1,
            "positions": one.clone(),
            "targets": one + pad_id,
            "mask": one.float(),
            "old_logprobs": one.float(),
            "advantages": torch.zeros(1),
            "lengths": torch.ones(1, dtype=torch.long),
        }
        if batch.ref_logprobs is not None:
            out["ref_logprobs"] = one.float()
        return out
    for r in rows:
        if len(r.prompt_ids) == 0:
            raise StreamRLError(
                f"rollout {r.rollout_id} has an empty prompt, so its first completion token has no "
                "predicting position; prompts must hold at least one token (e.g. BOS)"
            )
    out = pack_completions([r.prompt_ids for r in rows], [r.completion_ids for r in rows], pad_id)
    extra = -out["input_ids"].shape[1] % multiple
    if extra:  # right padding: under causal attention no real token sees it, and no position points at it
        out["input_ids"] = torch.nn.functional.pad(out["input_ids"], (0, extra), value=pad_id)
        out["attention_mask"] = torch.nn.functional.pad(out["attention_mask"], (0, extra), value=0)
    B, T = out["positions"].shape
    mask = torch.zeros((B, T), dtype=torch.float32)
    old = torch.zeros((B, T), dtype=torch.float32)
    ref = torch.zeros((B, T), dtype=torch.float32) if batch.ref_logprobs is not None else None
    for i, r in enumerate(rows):
        c = len(r.completion_ids)
        weight = 1.0 if batch.loss_mask is None else float(batch.loss_mask[i])
        # Observation tokens of a multi-turn episode (obs_spans) are context, never trained on.
        mask[i, :c] = torch.from_numpy(r.token_mask() * weight) if r.obs_spans else weight
        # torch.tensor copies: decoded arrays are read-only views of the message (from_numpy warns on them)
        old[i, :c] = torch.tensor(np.asarray(r.logprobs, dtype=np.float32))
        if ref is not None:
            ref_row = np.asarray(batch.ref_logprobs[i], dtype=np.float32)
            if len(ref_row) != c:
                raise StreamRLError(
                    f"rollout {r.rollout_id}: {len(ref_row)} reference log-probs for {c} completion "
                    "tokens; the reference worker must annotate every completion token"
                )
            ref[i, :c] = torch.tensor(ref_row)
    out.update(mask=mask, old_logprobs=old, advantages=torch.as_tensor(np.asarray(batch.advantages, dtype=np.float32)))
    if ref is not None:
        out["ref_logprobs"] = ref
    return out


def num_micro_batches(batch_size: int, world: int, micro_batch_size: int) -> int:
    """Micro-batches per rank: the same on every rank (FSDP's collectives must line up)."""
    largest_shard = -(-batch_size // world)
    return max(1, -(-largest_shard // micro_batch_size))


def pack_by_tokens(lengths: list[int], micro_batch_size: int, micro_batch_tokens: int) -> list[list[int]]:
    """Row indices of each micro-batch: rows sorted longest first, a micro-batch closed before its
    padded size (rows x longest row) would pass micro_batch_tokens or its rows micro_batch_size.
    A row longer than the budget trains alone. Sorting keeps rows of similar length together, so
    little of each [rows, longest] input is padding."""
    out: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        # The first row of a micro-batch is its longest (sorted): that length sets its padded size.
        if out and len(out[-1]) < micro_batch_size and lengths[out[-1][0]] * (len(out[-1]) + 1) <= micro_batch_tokens:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def plan_micro_batches(
    batch: Batch, world: int, micro_batch_size: int, micro_batch_tokens: int
) -> list[list[list[int]]]:
    """For each data-parallel rank, the row indices (into its batch.shard) of each micro-batch; every
    rank gets the same number (FSDP's collectives must line up), padded with empty micro-batches.

    micro_batch_tokens = 0: contiguous slices of at most micro_batch_size rows (num_micro_batches)."""
    shards = [batch.shard(r, world) for r in range(world)]
    if not micro_batch_tokens:
        k = num_micro_batches(len(batch), world, micro_batch_size)
        return [[list(range(i * len(s) // k, (i + 1) * len(s) // k)) for i in range(k)] for s in shards]
    plans = [
        pack_by_tokens(
            [len(r.prompt_ids) + len(r.completion_ids) for r in s.rollouts], micro_batch_size, micro_batch_tokens
        )
        for s in shards
    ]
    k = max(1, max(len(p) for p in plans))
    return [p + [[] for _ in range(k - len(p))] for p in plans]


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


def _load_model(model_path: str, dtype: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    # Dropout off: recomputed log-probs must be deterministic (they are compared with the sampler's,
    # and prox_logprobs reuses this forward's values).
    for key, value in vars(config).items():
        if "dropout" in key and isinstance(value, float):
            setattr(config, key, 0.0)
    # Master weights stay float32; a lower model.dtype becomes FSDP's compute dtype instead.
    model = AutoModelForCausalLM.from_pretrained(model_path, config=config, dtype=torch.float32)
    return model, getattr(torch, dtype)


def shard_model(model: torch.nn.Module, mesh, compute_dtype: torch.dtype) -> None:
    """fully_shard each decoder layer, then the root (in place)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    layer_names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in layer_names]
    if not layers:
        raise ConfigError(
            f"{type(model).__name__} declares no decoder layer classes (_no_split_modules), so the "
            "trainer cannot shard it per layer; use a transformers model class that declares them"
        )
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)


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


class TrainEngine(TrainerEngine):
    """One rank's FSDP2 model + AdamW; every method is collective (all ranks call it in step).

    Subclasses (streamrl/train/titan_engine.py) build another model in `_build` and keep the rest."""

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

    def _build(self, model_path: str) -> None:
        """Load the model onto this rank and shard it: sets model, pad_id, vocab_size."""
        from torch.distributed.device_mesh import init_device_mesh

        tc = self.cfg.trainer
        model, compute_dtype = _load_model(model_path, self.cfg.model.dtype)
        self.pad_id = int(model.config.pad_token_id or 0)
        self.vocab_size = getattr(model.config, "vocab_size", None)
        if tc.activation_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.to(self.device)
        model.train()
        if tc.logprob_chunk_tokens:
            check_plain_head(model)  # a model chunking cannot serve fails here, not at the first step
        shard_model(model, init_device_mesh(self.device.type, (self.world_size,)), compute_dtype)
        self.model = model

    def _init_optimizer(self) -> None:
        """AdamW over self.model, the lr schedule, the loss's inputs; shared by every backend."""
        tc = self.cfg.trainer
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=tc.lr, weight_decay=tc.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, partial(lr_factor, tc))
        self.loss = resolve_loss(self.cfg)
        self.requirements = loss_requirements(self.loss)
        self.steps_done = 0
        self._mismatch = MismatchMeter()

    def logprobs(self, padded: dict[str, Tensor], with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        """Current-policy log-probs [B, T] of the completion tokens (graph kept for backward).

        The reference worker's function (streamrl.models.hf.causal_lm_logprobs): with
        trainer.logprob_chunk_tokens > 0 the logits are formed a chunk of tokens at a time from the
        decoder's hidden states (streamrl.train.logprobs); 0 materialises the model's full logits."""
        return causal_lm_logprobs(
            self.model,
            padded,
            self.cfg.generator.temperature,
            self.cfg.trainer.logprob_chunk_tokens,
            with_entropy,
            self.cfg.trainer.logprob_kernel,
        )

    def model_inputs(self, mb: Batch) -> dict[str, Tensor]:
        """The CPU tensors of one micro-batch that `logprobs` reads (pad_batch's)."""
        return pad_batch(mb, self.pad_id, self.cfg.trainer.seq_multiple())

    def _micro_step(self, mb: Batch, total_tokens: float, total_seqs: float) -> dict[str, float]:
        padded = {k: v.to(self.device) for k, v in self.model_inputs(mb).items()}
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
        if "ref_logprobs" in self.requirements and batch.ref_logprobs is None:
            raise ConfigError(
                "the loss needs ref_logprobs but the batch has none; with loss.kl_beta > 0 "
                "the assembler must wait for the reference workers' annotation"
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
            ref = [np.zeros(completion, np.float32)] * rows if "ref_logprobs" in self.requirements else None
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

    def full_state_dict(self) -> dict[str, Tensor] | None:
        """Full HF-named weights on rank 0 (detached CPU copies), None elsewhere; collective."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        # cpu_offload gathers one tensor at a time to rank 0's CPU: no full copy on other ranks.
        state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank != 0:
            return None
        # With one CPU rank the "gathered" tensor IS the live parameter; the caller publishes this
        # dict while training continues, so copy exactly those (other ranks' gathers are fresh).
        live = {p.to_local().untyped_storage().data_ptr() for p in self.model.parameters()}
        live |= {b.untyped_storage().data_ptr() for b in self.model.buffers()}
        out = {}
        for key, value in state.items():
            value = value.detach().to("cpu").contiguous()
            out[key] = value.clone() if value.untyped_storage().data_ptr() in live else value
        return out

    def weight_stream(self) -> WeightStream:
        """One parameter all-gathered at a time; transformers modules already carry HF names."""
        return module_weight_stream(self.model, receiver=self.rank == 0)
