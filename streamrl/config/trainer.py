"""The trainer: ranks, optimizer, micro-batching, backend and parallelism, checkpoints."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from streamrl.config.base import Section


class ParallelismConfig(Section):
    """How the trainer's ranks split the model (torchtitan backend; `hf` supports plain FSDP2 only)."""

    dp_replicate: int = Field(1, ge=1)
    """Data-parallel replicas (HSDP's replicate dimension); each replica holds a full sharded copy."""
    dp_shard: int = Field(-1, ge=-1)
    """FSDP2 shard degree; -1 = every rank left over: world_size / (dp_replicate * tp)."""
    tp: int = Field(1, ge=1)
    """Tensor-parallel degree; must divide the model's attention and KV heads."""
    compile: bool = False
    """torch.compile each decoder block (torchtitan backend)."""
    ac_policy: Literal["full", "selective"] = "full"
    """torchtitan's checkpointing policy when trainer.activation_checkpointing is on."""

    def shard_degree(self, world_size: int) -> int:
        """dp_shard with -1 resolved; raises ValueError when the degrees do not multiply to world_size."""
        rest = world_size // (self.dp_replicate * self.tp)
        shard = rest if self.dp_shard == -1 else self.dp_shard
        if shard < 1 or shard * self.dp_replicate * self.tp != world_size:
            raise ValueError(
                f"trainer.parallelism: dp_replicate={self.dp_replicate} * dp_shard={self.dp_shard} * "
                f"tp={self.tp} does not make trainer.world_size={world_size}; set dp_shard=-1 or make the "
                "product equal world_size"
            )
        return shard


class LoraConfig(Section):
    """Low-rank adapters (LoRA): the trainer trains only these; every publish ships only them."""

    rank: int = Field(0, ge=0)
    """Adapter rank r; 0 = off (full-weight training and publish)."""
    alpha: float = Field(16.0, gt=0)
    """Scaling numerator: the adapter's update is (alpha / rank) * B @ A."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapter's input during training (0 keeps trainer and generator log-probs equal)."""
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj"]
    """Module names (the last part of each Linear's HF name) that get an adapter."""

    @property
    def enabled(self) -> bool:
        return self.rank > 0


class TrainerConfig(Section):
    world_size: int = Field(1, ge=1)
    """torch.distributed ranks (FSDP2 shards over them); gloo on CPU, NCCL on GPU."""
    steps: int = Field(60, ge=1)
    """Optimizer steps of the run (each publishes a policy version); the job ends after the last."""
    lr: float = Field(1e-6, gt=0)
    """AdamW learning rate (1e-6 suits billion-parameter models; the tiny CPU model uses 3e-3)."""
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    micro_batch_size: int = Field(64, ge=1)
    """Sequences per forward/backward on one rank."""
    micro_batch_tokens: int = Field(0, ge=0)
    """Token budget of one micro-batch: rows are sorted by length and packed while rows x longest row
    stays within it (and rows within micro_batch_size), so little of each forward is padding;
    metrics.jsonl's padded_tokens vs input_tokens shows the waste. 0 = slices of micro_batch_size rows."""
    seq_bucket: int | None = Field(None, ge=1)
    """Pad each micro-batch's input length up to a multiple of this many tokens (right padding, masked
    from the loss), so micro-batches whose longest row differs by a few tokens share one shape: under
    torch.compile a new length recompiles, and the recompile makes a dynamic-shape graph. None = 16
    with trainer.parallelism.compile (the torchtitan backend), else 1 (no padding)."""
    pack_rows: int = Field(0, ge=0)
    """torchtitan backend: pack each micro-batch's rollouts back to back into rows of at most this many
    tokens (a longer rollout gets a row of its own), attention masked to each rollout (a document
    BlockMask on GPU), instead of right-padding every rollout to the longest; the per-token log-probs
    go back to the rollout layout, so losses are unchanged. 0 = padded rows."""
    logprob_chunk_tokens: int = Field(2048, ge=0)
    """Tokens whose logits are formed at once when recomputing log-probs (streamrl/models/logprobs.py): the
    [tokens, vocab] float32 logits never exist whole, the backward recomputes each chunk's. 0 = the
    model's full logits (more activation memory, no recomputation). The reference worker computes its
    log-probs with the same setting, so both sides of the KL term come from one computation."""
    logprob_kernel: Literal["auto", "compiled", "eager"] = "auto"
    """How each chunk's float32 softmax work (log-sum-exp, target log-prob, entropy and their gradient)
    runs: `compiled` = torch.compile'd (one or two reading passes over the chunk's logits), `eager` =
    plain torch ops (~10 float32 passes per step), `auto` = compiled on CUDA, eager on CPU (inductor's
    CPU compile time outweighs the tiny CPU models' chunks). Used by the trainer and reference worker."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    backend: Literal["hf", "torchtitan"] = "hf"
    """Model definitions: `hf` = transformers AutoModelForCausalLM + FSDP2; `torchtitan` = torchtitan's
    Llama 3 / Qwen 3 with its parallelize functions (trainer.parallelism), weights still in HF names."""
    parallelism: ParallelismConfig = ParallelismConfig()
    """Data-parallel shard/replicate degrees, tensor parallel, compile."""
    lora: LoraConfig = LoraConfig()
    """Train and publish low-rank adapters only (off by default: rank 0)."""
    seed: int = 0
    """torch seed set on every rank before the model loads."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate decay over trainer.steps, down to lr * min_lr_ratio at the last step."""
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    warmup_steps: int = Field(0, ge=0)
    """Linear warm-up from 0 over this many steps, then the schedule."""
    log_entropy: bool = True
    """Log the policy's mean token entropy each step (costs one extra [tokens, vocab] pass)."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward: less memory, ~30% more compute."""
    checkpoint_every: int = Field(10, ge=1)
    """Save a checkpoint (RUN_DIR/checkpoints, torch.distributed.checkpoint) every this many steps,
    and at the end or on a graceful stop. Steps after the newest checkpoint are replayed on resume."""
    checkpoint_async: bool = True
    """Write checkpoints on a background thread: training pays only for staging the state (a CPU
    copy); the checkpoint becomes visible, and what it covers is acked, once the write completes.
    False: the trainer waits for the write (metrics.jsonl `checkpoint_stall_s` shows the cost)."""
    checkpoint_keep: int = Field(2, ge=1)
    """Checkpoints kept on disk (older ones are deleted after a newer one is complete)."""
    warm_up: bool | None = None
    """Before the first batch (while the generators start), run a forward + backward of dummy
    micro-batches of generator.max_tokens tokens (two lengths; one, the bucket of a short prompt and
    a full completion, when trainer.seq_bucket pads to a multiple), gradients discarded (weights,
    optimizer and lr schedule untouched), so the first step does not also pay CUDA's kernel
    selection and torch.compile. None: on CUDA only."""
    trim_every_s: float = Field(10.0, gt=0)
    """How often the trainer trims the streams below what every consumer group has consumed."""

    def seq_multiple(self) -> int:
        """seq_bucket with None resolved (see its docstring)."""
        if self.seq_bucket is not None:
            return self.seq_bucket
        return 16 if self.parallelism.compile else 1

    @model_validator(mode="after")
    def _parallelism(self) -> "TrainerConfig":
        par = self.parallelism
        par.shard_degree(self.world_size)
        if self.backend == "hf" and (par.dp_replicate > 1 or par.tp > 1 or par.compile):
            raise ValueError(
                "trainer.parallelism dp_replicate/tp/compile need trainer.backend=torchtitan; the hf backend "
                "shards with plain FSDP2 over all ranks (set them back to 1/false or switch the backend)"
            )
        if self.backend == "torchtitan" and self.lora.enabled:
            raise ValueError(
                "trainer.lora needs trainer.backend=hf (the torchtitan backend trains full weights only); "
                "set trainer.backend=hf, or trainer.lora.rank=0 to train the full model on torchtitan"
            )
        if self.backend == "hf" and self.pack_rows:
            raise ValueError(
                "trainer.pack_rows needs trainer.backend=torchtitan (the hf backend trains right-padded rows); "
                "set trainer.pack_rows=0 or switch the backend"
            )
        return self
