"""The generator role: prompt groups in, one rollout per finished completion out, weights swapped in flight.

Reads `prompts` with consumer group "generator" (own pending first, then crashed consumers'
entries, then new ones) up to `generator.max_inflight_groups` groups, runs `group_size`
separate vLLM requests per group and publishes each completion to `rollouts` the moment it
finishes; the prompt entry is acked once all of its completions are published. The engine follows
the weight store meanwhile (streamrl/generate/weight_follower.py): a newer version is fetched while
generation continues, then the engine is paused (running requests keep their KV cache), reloaded and
resumed, and every token after the switch is recorded with the new version. With trainer.lora each
version is an adapter loaded next to the others without a pause; a request runs on the version
newest at its start to its end (streamrl/generate/lora_versions.py).

    streamrl worker generator --config configs/tiny-cpu.yaml    # (through the CLI)
    worker = GeneratorWorker(cfg, broker, "generator-0", run_dir); await worker.run()
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

from streamrl.config.schema import Config
from streamrl.core.accounting import fail_group
from streamrl.core.bounded_tasks import InFlight, settle_cancelled
from streamrl.core.broker import Broker, Entry
from streamrl.core.errors import ConfigError
from streamrl.core.messages import Prompt, Rollout, encode, new_rollout_id
from streamrl.core.worker import Worker
from streamrl.generate.engine_errors import is_bad_request, is_engine_dead
from streamrl.generate.episode_runner import EpisodeContext, EpisodeRunner
from streamrl.generate.loop_lag import LoopLag
from streamrl.generate.loop_profile import LoopProfiler
from streamrl.generate.lora_versions import lora_support_problem, max_loras, vllm_lora_rank
from streamrl.generate.running_requests import RunningRequests
from streamrl.generate.sample_stream import SampleStream
from streamrl.generate.vllm_engine import LoraSlots, VLLMEngine, sample_seed
from streamrl.generate.weight_follower import WeightFollower
from streamrl.weights.store import WeightLoader, make_loader

GROUP = "generator"
MAX_GROUP_ATTEMPTS = 3
MAX_GROUP_SIZE = 4096
"""A prompt asking for more completions than this is malformed (it would flood the engine)."""
CANCEL_WAIT_S = 10.0
"""On stop, how long cancelled groups (their vLLM aborts) may take to unwind before the engine shuts down."""


class GeneratorWorker(Worker):
    role = "generator"

    def __init__(
        self,
        cfg: Config,
        broker: Broker,
        worker_id: str,
        run_dir: Path | None = None,
        loader: WeightLoader | None = None,
    ):
        super().__init__(cfg, broker, worker_id, run_dir)
        if not cfg.model.path:
            raise ConfigError("the generator needs model.path; the supervisor sets it (or pass --set model.path=DIR)")
        self.loader = loader or make_loader(cfg, broker, self.run_dir)
        """The weight store's generator side: newest version, fetch, vLLM's reload call."""
        lora = cfg.trainer.lora
        slots = LoraSlots(vllm_lora_rank(lora.rank), max_loras(cfg)) if lora.enabled else None
        if slots is not None:  # vLLM re-reads an adapter's folder when it evicts and needs it again
            self.loader.local_copies = slots.max_loras + 2
        self.engine = VLLMEngine(
            cfg.model.path,
            cfg.generator,
            cfg.model.dtype,
            cfg.run.seed,
            extension=self.loader.vllm_extension,  # cuda_ipc's adds adapters from GPU memory too
            lora=slots,
        )
        self.groups = InFlight(cfg.generator.max_inflight_groups, self.consumer, self.keys.prompts, GROUP)
        """Prompt groups being generated, each holding its prompt entry."""
        self.loop_lag = LoopLag()
        self._lag_task: asyncio.Task | None = None
        every = cfg.generator.loop_profile_s
        self.loop_profile = LoopProfiler(every, self.loop_lag) if every else None
        """What holds the loop (generator.loop_profile_s): started with the lag timer, written at close."""
        self.requests = RunningRequests(on_change=self._update_busy)
        """The requests running on the engine: busy time, deliveries, the streams a switch marks."""
        self.weights = WeightFollower(
            cfg, self.engine, self.loader, self.requests, self.loop_lag, self.log, self.stats, self.count
        )
        """The engine following the weight store: the version each request runs on, the switches."""
        self._fatal: BaseException | None = None
        context = EpisodeContext.of(self, self.engine, self.weights.pinned, self.requests)
        self.episodes = EpisodeRunner(context) if cfg.env.fn else None
        """Multi-turn episodes (streamrl/generate/episode_runner.py) when env.fn is set."""

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        await self.broker.ensure_group(self.keys.prompts, GROUP)
        # Groups this id held in a previous life (it was killed) go to a live peer now, not after
        # broker.claim_idle_ms: the engine start below takes seconds. Alone, it reads them itself.
        if offered := await self.broker.offer(self.keys.prompts, GROUP, self.worker_id, self.cfg.broker.claim_idle_ms):
            self.log.info("offered_previous_groups", groups=offered)
        from transformers import AutoConfig

        self.vocab_size = getattr(AutoConfig.from_pretrained(self.cfg.model.path), "vocab_size", None)
        if self.weights.lora is not None and (problem := lora_support_problem()):
            raise ConfigError(problem)  # before the engine start: it would fail there after many seconds
        t0 = time.monotonic()
        await self.engine.start()
        self.log.info(
            "engine_started",
            seconds=round(time.monotonic() - t0, 2),
            model=self.cfg.model.path,
            start_method=self.engine.start_method,
            openmp_threads_released=self.engine.openmp_threads_released,
            prefix_caching=self.engine.prefix_cache.get("enabled"),
            block_size=self.engine.prefix_cache.get("block_size"),
        )
        if self.episodes is not None:
            await self.episodes.start()
        await self.weights.start()  # a late joiner loads the newest version before its first request
        self._lag_task = asyncio.create_task(self.loop_lag.run())
        if self.loop_profile is not None:
            self.loop_profile.start()

    async def step(self) -> bool:
        if (fatal := self._fatal or self.weights.fatal) is not None:
            raise fatal
        if not await self.groups.wait_slot(timeout=self.cfg.broker.block_ms / 1000):
            return False
        items = await self.read(self.keys.prompts, GROUP, count=self.groups.free(), expect=Prompt)
        trainer_version = int(await self.broker.get(self.keys.trainer_version) or 0) if items else 0
        for entry, prompt in items:
            if entry.id in self.groups:  # our own in-flight entry, re-claimed after a long idle
                continue
            if reason := self._invalid(prompt, trainer_version):
                await self._reject(entry, prompt, reason)
                continue
            self._launch(entry, prompt, attempt=1)
        return bool(items)

    def stop_budget_s(self) -> float:
        return self.cfg.generator.drain_timeout_s + CANCEL_WAIT_S + 15.0

    async def close(self) -> None:
        t0 = time.monotonic()
        if self.groups:
            grace = self.cfg.generator.drain_timeout_s
            self.log.info("draining", groups=len(self.groups), grace_s=grace, policy_version=self.weights.version)
            pending = await self._drain(grace)
            for task in pending:  # cancelling a stream aborts its vLLM request; the prompt stays un-acked
                task.cancel()
            await settle_cancelled(pending, self.log, "groups", CANCEL_WAIT_S)
            self.count("groups_aborted", len(pending))
            self.log.info("drained", seconds=round(time.monotonic() - t0, 2), aborted=len(pending))
        if self.episodes is not None:
            await self.episodes.close()
        await self.weights.close()
        if self.loop_profile is not None:  # before the timer stops: it tells blocked samples apart
            self._finish_loop_profile(self.loop_profile)
        if self._lag_task is not None:
            self._lag_task.cancel()
            await settle_cancelled({self._lag_task}, self.log, "loop_lag", CANCEL_WAIT_S)
            self.stats.update(self.loop_lag.summary())
        self._update_busy()
        self.engine.shutdown()
        await self.loader.close()

    async def _drain(self, grace: float, idle_s: float = 1.0, every_s: float = 0.25) -> set[asyncio.Task]:
        """Wait up to `grace` for the in-flight groups; the ones still running are returned. Multi-turn:
        once the engine has had nothing to do for `idle_s` while episodes wait for observations, the
        rest wait on env workers, which are stopping too (or hung: a step that never returns would
        hold the stop for all of `grace`). Their episodes are checkpointed at their last model turn,
        so the generator that takes the prompt over (or the resumed job) continues them."""
        if self.episodes is None:
            return await self.groups.drain(timeout=grace)
        deadline, idle_since = time.monotonic() + grace, None
        while True:
            left = deadline - time.monotonic()
            pending = await self.groups.drain(timeout=max(0.0, min(every_s, left)))
            if not pending or left <= every_s:
                return pending
            if not self.episodes.only_waiting_on_env():
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since >= idle_s:
                self.log.info("drain_ends_on_env", groups=len(pending), waited_s=round(idle_s, 2))
                return pending

    def _finish_loop_profile(self, profile: LoopProfiler) -> None:
        profile.stop()
        self.stats.update(profile.summary())
        if self.run_dir is None:
            return
        path = self.run_dir / "logs" / f"{self.worker_id}.loop_profile.txt"
        try:
            profile.write(path, f"of {self.worker_id}")
        except OSError as exc:  # a full or read-only disk must not fail the stop
            self.log.warning("loop_profile_not_written", path=str(path), error=str(exc))
        else:
            self.log.info("loop_profile_written", path=str(path))

    # -- one prompt group ------------------------------------------------------------------
    def _launch(self, entry: Entry, prompt: Prompt, attempt: int) -> None:
        self.groups.start(
            self._run_group(entry, prompt),
            hold=[entry.id],
            on_done=lambda t: self._group_done(entry, prompt, attempt, t),
        )

    def _group_done(self, entry: Entry, prompt: Prompt, attempt: int, task: asyncio.Task) -> None:
        """After the group's task ended and released its prompt: count a failure, maybe run it again."""
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self.count("group_errors")
            self.log.error("group_failed", entry_id=entry.id, attempt=attempt, error=repr(exc))
            if is_engine_dead(exc):
                self._fatal = exc
            elif attempt < MAX_GROUP_ATTEMPTS and not self.stopping.is_set():
                # A transient failure (e.g. the broker restarting): run the group again now rather
                # than leave its prompt pending until another worker's XAUTOCLAIM; completions
                # already published are generated again under new rollout ids, and the assembler
                # trains the first copy of each sample (docs/protocol.md, "Rollout ids").
                self._launch(entry, prompt, attempt + 1)

    def _invalid(self, prompt: Prompt, trainer_version: int) -> str:
        """Why a decodable prompt cannot be generated (it would hang or flood the engine)."""
        ids = prompt.prompt_ids
        if len(ids) == 0:
            return "empty prompt"
        if ids.min() < 0 or (self.vocab_size is not None and ids.max() >= self.vocab_size):
            return f"prompt token ids outside the vocabulary [0, {self.vocab_size})"
        if prompt.group_size > MAX_GROUP_SIZE:
            return f"group_size {prompt.group_size} exceeds {MAX_GROUP_SIZE}"
        if prompt.admitted_version > max(trainer_version, self.weights.version):
            return f"admitted at version {prompt.admitted_version}, but the trainer is at {trainer_version}"
        return ""

    async def _reject(self, entry: Entry, prompt: Prompt, reason: str) -> None:
        """Dead-letter a prompt that can never be generated; its group is closed as failed (slot freed)."""
        await self.dead_letter(self.keys.prompts, entry, reason)
        await fail_group(self.broker, self.keys, prompt.group_id, reason)
        await self.broker.ack(self.keys.prompts, GROUP, [entry.id])
        self.count("groups_rejected")

    async def _run_group(self, entry: Entry, prompt: Prompt) -> None:
        await self.weights.wait_for(prompt.admitted_version)  # the engine has weights at least that new
        if self.episodes is not None:  # a failed group is closed and dead-lettered by the runner
            done = await self.episodes.run_group(entry, prompt)
            await self.broker.ack(self.keys.prompts, GROUP, [entry.id])
            self.count("groups_done" if done else "groups_failed")
            return
        try:
            async with asyncio.TaskGroup() as tg:
                for s in range(prompt.group_size):
                    tg.create_task(self._run_sample(prompt, s))
        except ExceptionGroup as eg:
            if not all(is_bad_request(e) for e in eg.exceptions):
                raise
            # vLLM rejected the request itself (e.g. prompt longer than max_model_len): retrying
            # elsewhere cannot help, so it goes to the dead-letter stream and is acked.
            await self._reject(entry, prompt, f"vLLM rejected the prompt: {eg.exceptions[0]}")
            return
        await self.broker.ack(self.keys.prompts, GROUP, [entry.id])
        self.count("groups_done")

    async def _run_sample(self, prompt: Prompt, sample: int) -> None:
        params = self.engine.sampling_params(
            sample_seed(self.cfg.run.seed, prompt.group_id, sample),
            prompt.temperature,
            stream_interval=self.cfg.generator.stream_interval,
        )
        request_id = f"{self.worker_id}:{prompt.group_id}:{sample}:{uuid.uuid4().hex[:8]}"
        # Full weights: a switch marks where it fell in the stream (registered in the same step as
        # its first version is read). LoRA: the pinned adapter made all of it.
        with self.weights.pinned() as pin, self.requests.running(request_id, SampleStream(pin.version)) as s:
            async for delta in self.engine.stream(prompt.prompt_ids.tolist(), params, request_id, pin.request):
                self.requests.delivered()
                s.add(delta.token_ids, delta.logprobs)
                s.text.append(delta.text)
                if delta.finish_reason is not None:
                    s.finish_reason = delta.finish_reason
        version, switches = s.versions()
        rollout = Rollout(
            rollout_id=new_rollout_id(prompt.group_id, sample),
            group_id=prompt.group_id,
            sample=sample,
            group_size=prompt.group_size,
            prompt_ids=prompt.prompt_ids,
            completion_ids=s.token_ids,
            logprobs=s.logprobs,
            version=version,
            version_switches=switches,
            finish_reason=s.finish_reason,
            text="".join(s.text),
            prompt_text=prompt.text,
            meta=prompt.meta,
            worker=self.worker_id,
            finished_at=time.time(),
        )
        # No MAXLEN: the trainer trims below what every group consumed (streamrl.core.trimming).
        await self.broker.add(self.keys.rollouts_for(rollout.group_id), encode(rollout))
        self.count("rollouts")
        self.count("tokens_generated", len(s.token_ids))

    # -- stats -----------------------------------------------------------------------------
    def _update_busy(self) -> None:
        self.stats["busy_fraction"] = self.requests.busy_fraction()
        pc = self.engine.prefix_cache
        self.stats["requests_preempted"] = pc.get("preempted", 0)
        if pc["queries"]:
            self.stats.update(
                prefix_cache_queries=pc["queries"],
                prefix_cache_hits=pc["hits"],
                prefix_cache_hit_rate=round(pc["hits"] / pc["queries"], 4),
            )
