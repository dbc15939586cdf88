"""The generator role: prompt groups in, one rollout per finished completion out, weights swapped in flight.

Reads `prompts` with consumer group "generator" (own pending first, then crashed consumers'
entries, then new ones) up to `generator.max_inflight_groups` groups, runs `group_size`
separate vLLM requests per group and publishes each completion to `rollouts` the moment it
finishes; the prompt entry is acked once all of its completions are published. A background
task polls the weight store; a newer version is fetched while generation continues, then the
engine is paused (running requests keep their KV cache), reloaded and resumed, and every token
after the switch is recorded with the new version. With trainer.lora each version is an adapter
loaded next to the others without a pause; a request runs on the version newest at its start to its
end (streamrl/generate/adapters.py).

    streamrl worker generator --config configs/tiny-cpu.yaml    # (through the CLI)
    worker = GeneratorWorker(cfg, broker, "generator-0", run_dir); await worker.run()
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from pathlib import Path

from streamrl.config.schema import Config
from streamrl.core.accounting import close_group
from streamrl.core.bounded_tasks import InFlight, settle_cancelled
from streamrl.core.broker import Broker, Entry
from streamrl.core.errors import ConfigError, FatalError
from streamrl.core.messages import Prompt, Rollout, encode, new_rollout_id
from streamrl.core.worker import Worker
from streamrl.generate.adapters import (
    AdapterVersions,
    LivePin,
    kind_mismatch,
    lora_support_problem,
    max_loras,
    vllm_lora_rank,
)
from streamrl.generate.engine_errors import is_bad_request, is_engine_dead
from streamrl.generate.episode_runner import EpisodeRunner
from streamrl.generate.join_weights import fetch_newest
from streamrl.generate.loop_lag import LoopLag
from streamrl.generate.loop_profile import LoopProfiler
from streamrl.generate.sample_stream import SampleStream
from streamrl.generate.vllm_engine import LoraSlots, VLLMEngine, sample_seed
from streamrl.weights.store import WeightHandle, WeightLoader, WeightStoreError, make_loader

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
        self.adapters = AdapterVersions(max_loras(cfg)) if lora.enabled else None
        """trainer.lora: the adapter versions in the engine and the requests pinned to each; None: full weights."""
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
        self.version = 0
        """Weights version the engine generates with right now (0: the initial model)."""
        self._settling: asyncio.Future | None = None
        """The newest adapter version's `loader.settle`, running in a thread after its switch."""
        self.groups = InFlight(cfg.generator.max_inflight_groups, self.consumer, self.keys.prompts, GROUP)
        """Prompt groups being generated, each holding its prompt entry."""
        self._version_cond: asyncio.Condition | None = None
        self._watcher: asyncio.Task | None = None
        self.loop_lag = LoopLag()
        self._lag_task: asyncio.Task | None = None
        every = cfg.generator.loop_profile_s
        self.loop_profile = LoopProfiler(every, self.loop_lag) if every else None
        """What holds the loop (generator.loop_profile_s): started with the lag timer, written at close."""
        self._deliveries = 0
        self._samples: dict[str, SampleStream] = {}
        """The running requests' samples by request id: a full-weights switch marks each (tokens_made)."""
        self._active = 0
        self._busy_since = 0.0
        self._busy_s = 0.0
        self._fatal: BaseException | None = None
        self._started_mono = time.monotonic()
        self.episodes = EpisodeRunner(self) if cfg.env.fn else None
        """Multi-turn episodes (streamrl/generate/episode_runner.py) when env.fn is set."""

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        self._version_cond = asyncio.Condition()
        await self.broker.ensure_group(self.keys.prompts, GROUP)
        # Groups this id held in a previous life (it was killed) go to a live peer now, not after
        # broker.claim_idle_ms: the engine start below takes seconds. Alone, it reads them itself.
        if offered := await self.broker.offer(self.keys.prompts, GROUP, self.worker_id, self.cfg.broker.claim_idle_ms):
            self.log.info("offered_previous_groups", groups=offered)
        from transformers import AutoConfig

        self.vocab_size = getattr(AutoConfig.from_pretrained(self.cfg.model.path), "vocab_size", None)
        if self.adapters is not None and (problem := lora_support_problem()):
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
        # A late joiner loads the newest version before its first request.
        if joined := await fetch_newest(self.loader, self.version, self.log, lambda: self.count("join_fetch_failed")):
            await self._switch(*joined, joining=True)
        self.stats["policy_version"] = self.version
        self._watcher = asyncio.create_task(self._watch_weights())
        self._lag_task = asyncio.create_task(self.loop_lag.run())
        if self.loop_profile is not None:
            self.loop_profile.start()

    async def step(self) -> bool:
        if self._fatal is not None:
            raise self._fatal
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
            self.log.info("draining", groups=len(self.groups), grace_s=grace, policy_version=self.version)
            pending = await self.groups.drain(timeout=grace)
            for task in pending:  # cancelling a stream aborts its vLLM request; the prompt stays un-acked
                task.cancel()
            await settle_cancelled(pending, self.log, "groups", CANCEL_WAIT_S)
            self.count("groups_aborted", len(pending))
            self.log.info("drained", seconds=round(time.monotonic() - t0, 2), aborted=len(pending))
        if self.episodes is not None:
            await self.episodes.close()
        if self._watcher is not None:
            self._watcher.cancel()
            await settle_cancelled({self._watcher}, self.log, "weights_watcher", CANCEL_WAIT_S)
        if self.loop_profile is not None:  # before the timer stops: it tells blocked samples apart
            self._finish_loop_profile(self.loop_profile)
        if self._lag_task is not None:
            self._lag_task.cancel()
            await settle_cancelled({self._lag_task}, self.log, "loop_lag", CANCEL_WAIT_S)
            self.stats.update(self.loop_lag.summary())
        self._update_busy()
        await self._settled()
        self.engine.shutdown()
        await self.loader.close()

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
        if prompt.admitted_version > max(trainer_version, self.version):
            return f"admitted at version {prompt.admitted_version}, but the trainer is at {trainer_version}"
        return ""

    async def _reject(self, entry: Entry, prompt: Prompt, reason: str) -> None:
        """Dead-letter a prompt that can never be generated; its group is closed as failed (slot freed)."""
        await self.dead_letter(self.keys.prompts, entry, reason)
        if await close_group(self.broker, self.keys, prompt.group_id, "failed"):
            await self.broker.incr(self.keys.stat("groups_failed"))  # metrics.jsonl's `failed`
        await self.broker.ack(self.keys.prompts, GROUP, [entry.id])
        self.count("groups_rejected")

    async def _run_group(self, entry: Entry, prompt: Prompt) -> None:
        await self._wait_for_version(prompt.admitted_version)
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

    async def _wait_for_version(self, needed: int) -> None:
        """Hold the group until the engine has weights at least as new as at its admission."""
        if self.version >= needed:
            return
        self.log.info("waiting_for_weights", needed=needed, policy_version=self.version)
        async with self._version_cond:
            await self._version_cond.wait_for(lambda: self.version >= needed)

    async def _run_sample(self, prompt: Prompt, sample: int) -> None:
        params = self.engine.sampling_params(
            sample_seed(self.cfg.run.seed, prompt.group_id, sample),
            prompt.temperature,
            stream_interval=self.cfg.generator.stream_interval,
        )
        request_id = f"{self.worker_id}:{prompt.group_id}:{sample}:{uuid.uuid4().hex[:8]}"
        self._set_active(+1)
        try:
            with self.pinned() as pin:
                # Full weights: _reload_full marks where each switch fell (the sample is registered
                # in the same step as its first version is read). LoRA: its own adapter made it all.
                s = self._samples[request_id] = SampleStream(pin.version)
                async for delta in self.engine.stream(prompt.prompt_ids.tolist(), params, request_id, pin.request):
                    self._deliveries += 1
                    s.add(delta.token_ids, delta.logprobs)
                    s.text.append(delta.text)
                    if delta.finish_reason is not None:
                        s.finish_reason = delta.finish_reason
        finally:
            self._samples.pop(request_id, None)
            self._set_active(-1)
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

    # -- weights ---------------------------------------------------------------------------
    def pinned(self):
        """The policy one request runs on (`with self.pinned() as pin`): pin.request goes to the
        engine, pin.version stamps each delta. LoRA: the adapter version newest at the start, to the
        end. Full weights: whatever is loaded when each delta arrives (pin.request is None)."""
        if self.adapters is not None:
            return self.adapters.pin()
        return contextlib.nullcontext(LivePin(lambda: self.version))

    async def _watch_weights(self) -> None:
        poll = self.cfg.generator.weights_poll_s
        while True:
            try:
                newest = await self.loader.latest()
                if newest is not None and newest.version > self.version:
                    seen = time.time()
                    path = await self.loader.fetch(newest)  # prefetch: generation keeps running
                    # Before the pause: publish -> noticed (the poll) and the prefetch.
                    lead = {"notice_s": round(seen - newest.created_at, 4), "fetch_s": round(time.time() - seen, 4)}
                    if not await self._switch_within(newest, path, self.cfg.generator.switch_timeout_s, lead):
                        return
            except WeightStoreError as exc:
                self.log.warning("weights_fetch_failed", error=str(exc))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.log.exception("weights_switch_failed", error=repr(exc))
                if is_engine_dead(exc):
                    self._fatal = exc
                    return
            try:  # a publish wakes this at once; `poll` bounds the wait
                await self.loader.wait_for_publish(poll)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.log.warning("weights_wait_failed", error=repr(exc))
                await asyncio.sleep(poll)

    async def _switch_within(self, handle: WeightHandle, path: str, timeout: float, lead: dict | None = None) -> bool:
        """`_switch`, or on a hang past `timeout` mark the engine broken (step() then raises, the
        worker exits and is restarted). asyncio.wait, not wait_for: a stuck call may not unwind."""
        task = asyncio.ensure_future(self._switch(handle, path, lead=lead))
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if done:
            task.result()
            return True
        task.cancel()
        self._fatal = RuntimeError(
            f"switching to weights version {handle.version} (pause, load, resume) did not finish in "
            f"{timeout:g}s; the vLLM engine looks stuck, so this generator exits to be restarted "
            f"(raise generator.switch_timeout_s if loading this model legitimately takes longer)"
        )
        self.log.error("weights_switch_hung", policy_version=handle.version, timeout_s=timeout)
        return False

    async def _switch(self, handle: WeightHandle, path: str, joining: bool = False, lead: dict | None = None) -> None:
        """Pause (keep running requests), drain their delivered tokens, reload, resume; with LoRA
        only add the new adapter (running requests keep theirs)."""
        t0 = time.monotonic()
        marks: list[tuple[str, float]] = []
        if handle.is_adapter != (self.adapters is not None):
            self._fatal = kind_mismatch(handle.version, handle.is_adapter)
            raise self._fatal
        if self.adapters is not None:  # no pause: requests started from now on use the new adapter
            await self._settled()  # the previous version's folder is complete first
            await self.adapters.switch(
                self.engine, handle.version, path, marks, lambda r: self.loader.adapter_call(handle, r)
            )
            self.version = handle.version
            self._settling = asyncio.ensure_future(asyncio.to_thread(self.loader.settle, handle, path))
        else:
            await self._reload_full(handle, path, marks)
        now = time.monotonic()
        paused_s = now - t0
        # Each phase's share of the pause: where a slow switch spends its time (docs/performance.md).
        phases, last = dict(lead or {}), t0
        for name, t in marks:
            phases[name], last = round(t - last, 4), t
        # The loop's worst delay between the publish and now: how much of notice/pause was a busy loop.
        phases["loop_lag_max_s"] = self.loop_lag.max_since(handle.created_at)
        latency = time.time() - handle.created_at
        self.count("weight_switches")
        self.stats.update(
            policy_version=self.version, last_switch_paused_s=round(paused_s, 4), last_switch_phases=phases
        )
        if not joining:  # at start-up the publish->ready time mostly measures the engine start
            self.stats["last_switch_latency_s"] = round(latency, 4)
        self.log.info(
            "weights_loaded",
            policy_version=self.version,
            switch_latency_s=round(latency, 4),
            paused_s=round(paused_s, 4),
            **phases,
            kv_cache=self.cfg.generator.switch_kv_cache,
            active_requests=self._active,
            joining=joining,
        )
        async with self._version_cond:
            self._version_cond.notify_all()

    async def _settled(self) -> None:
        """Wait for the previous adapter version's `loader.settle` (its failure is logged: vLLM needs
        the folder only if it evicts that version while a request still runs on it)."""
        if self._settling is None:
            return
        task, self._settling = self._settling, None
        try:
            await task
        except Exception as exc:
            self.log.warning("adapter_settle_failed", error=repr(exc))

    async def _reload_full(self, handle: WeightHandle, path: str, marks: list) -> None:
        try:
            # Inside the try: a pause that fails half-way (the engine already paused) is resumed.
            await self.engine.pause()
            marks.append(("pause_s", time.monotonic()))
            await self._drain_deliveries()
            marks.append(("drain_s", time.monotonic()))
            await self.engine.reload(*self.loader.reload_call(path))
            marks.append(("reload_s", time.monotonic()))
            # Still paused: each request's token count now is where the new weights start. With
            # generator.stream_interval 0 (one output at the end) or > 1 some of those tokens are
            # still held in vLLM and arrive after the resume; the drain above let finished requests'
            # consumers take theirs (a finished request is no longer counted by the engine).
            try:
                counts = self.engine.token_counts(list(self._samples))
            except FatalError as exc:  # every later switch would fail the same way: the worker exits
                self._fatal = exc
                raise
            for request_id, sample in self._samples.items():
                made = counts[request_id]
                sample.switch_at(len(sample.token_ids) if made is None else made, handle.version)
            self.version = handle.version
        finally:
            await self.engine.resume()
        marks.append(("resume_s", time.monotonic()))

    async def _drain_deliveries(self, quiet_s: float = 0.005) -> None:
        """Let request consumers take every delta the paused engine already emitted.

        pause(mode="keep") returns only after the engine's output queue is flushed, so once no
        consumer has received anything for two short intervals, nothing made with the old
        weights is still waiting to be attributed.
        """
        quiet = 0
        while quiet < 2:
            before = self._deliveries
            await asyncio.sleep(quiet_s)
            quiet = quiet + 1 if self._deliveries == before else 0

    def tokens_made(self) -> int:
        """Tokens the running requests have made, delivered or still held in vLLM: progress
        that, unlike `_deliveries`, moves while requests hold their tokens back (stream_interval 0)."""
        return sum(self.engine.generated_tokens(rid) or len(s.token_ids) for rid, s in self._samples.items())

    # -- stats -----------------------------------------------------------------------------
    def _set_active(self, delta: int) -> None:
        now = time.monotonic()
        if self._active > 0:
            self._busy_s += now - self._busy_since
        self._busy_since = now
        self._active += delta
        self._update_busy()

    def _update_busy(self) -> None:
        up = max(time.monotonic() - self._started_mono, 1e-9)
        busy = self._busy_s + (time.monotonic() - self._busy_since if self._active > 0 else 0.0)
        self.stats["busy_fraction"] = round(min(busy / up, 1.0), 4)
        pc = self.engine.prefix_cache
        self.stats["requests_preempted"] = pc.get("preempted", 0)
        if pc["queries"]:
            self.stats.update(
                prefix_cache_queries=pc["queries"],
                prefix_cache_hits=pc["hits"],
                prefix_cache_hit_rate=round(pc["hits"] / pc["queries"], 4),
            )
