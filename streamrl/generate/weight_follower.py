"""A generator's engine following the weight store: the newest version at start-up, then each newer
one while generation runs, and the version every request runs on (workers/generator.py owns one).

Full weights: a background task polls `weights:latest` (between polls it blocks on the
`weights:published` stream, so a publish is noticed at once), fetches a newer version while
generation continues, then pauses the engine (running requests keep their KV cache), lets the
request consumers take every delta already made, reloads, marks in each running request's stream
where the new version starts, and resumes. With trainer.lora each version is an adapter added next to
the others with no pause (streamrl/generate/lora_versions.py); a request runs on the version newest
at its start to its end.

    weights = WeightFollower(cfg, engine, loader, requests, loop_lag, log, stats, count)
    await weights.start()                     # the newest version, then the watcher task
    await weights.wait_for(prompt.admitted_version)
    with weights.pinned() as pin: ...         # pin.request to the engine, pin.version on each delta
    await weights.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Callable

from streamrl.config.schema import Config
from streamrl.core.bounded_tasks import settle_cancelled
from streamrl.core.errors import FatalError
from streamrl.generate.engine_errors import is_engine_dead
from streamrl.generate.loop_lag import LoopLag
from streamrl.generate.lora_versions import LivePin, LoraVersions, kind_mismatch, max_loras
from streamrl.generate.running_requests import RunningRequests
from streamrl.weights.store import WeightHandle, WeightLoader, WeightStoreError

JOIN_FETCH_WAIT_S = 30.0
"""How long a starting generator reads the newest weights again while they are unreadable: a resumed
trainer republishes the versions above its checkpoint (each folder replaced) and collects older ones
meanwhile, so the files `weights:latest` names may be gone for a moment. One that stays unreadable
(e.g. `weights.backend: shm` on another host) ends the start with the loader's message."""
JOIN_RETRY_WAIT_S = 1.0
"""The wait between those reads (a publish ends it at once)."""
STOP_WAIT_S = 10.0
"""On close, how long the cancelled watcher may take to unwind."""


class WeightFollower:
    def __init__(
        self,
        cfg: Config,
        engine,
        loader: WeightLoader,
        requests: RunningRequests,
        loop_lag: LoopLag,
        log: Any,
        stats: dict,
        count: Callable[..., None],
    ):
        """`engine`: the generator's VLLMEngine; `requests`: what runs on it (a switch marks and
        counts them); `loop_lag`: its worst delay goes on each switch's log line; `log`, `stats`,
        `count`: the generator's (its heartbeat and `stopped` line)."""
        self.cfg = cfg.generator
        self.engine = engine
        self.loader = loader
        self.requests = requests
        self.loop_lag = loop_lag
        self.log, self.stats, self.count = log, stats, count
        self.lora = LoraVersions(max_loras(cfg)) if cfg.trainer.lora.enabled else None
        """trainer.lora: the adapter versions in the engine and the requests pinned to each; None: full weights."""
        self.version = 0
        """Weights version the engine generates with right now (0: the initial model)."""
        self.fatal: BaseException | None = None
        """Set when following cannot go on (a hung switch, an engine dead, a version of the other kind):
        the generator's next step raises it and the worker exits."""
        self._settling: asyncio.Future | None = None
        """The newest adapter version's `loader.settle`, running in a thread after its switch."""
        self._version_cond = asyncio.Condition()
        self._watcher: asyncio.Task | None = None

    async def start(self) -> None:
        """Load the newest version before the first request (a late joiner), then watch for newer ones."""
        if joined := await self._fetch_newest():
            await self.switch(*joined, joining=True)
        self.stats["policy_version"] = self.version
        self._watcher = asyncio.create_task(self._watch())

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            await settle_cancelled({self._watcher}, self.log, "weights_watcher", STOP_WAIT_S)
        await self.settled()

    def pinned(self):
        """The policy one request runs on (`with weights.pinned() as pin`): pin.request goes to the
        engine, pin.version stamps each delta. LoRA: the adapter version newest at the start, to the
        end. Full weights: whatever is loaded when each delta arrives (pin.request is None)."""
        if self.lora is not None:
            return self.lora.pin()
        return contextlib.nullcontext(LivePin(lambda: self.version))

    async def wait_for(self, needed: int) -> None:
        """Return once the engine has weights at least as new as `needed` (a group's admission version)."""
        if self.version >= needed:
            return
        self.log.info("waiting_for_weights", needed=needed, policy_version=self.version)
        async with self._version_cond:
            await self._version_cond.wait_for(lambda: self.version >= needed)

    async def _fetch_newest(self) -> tuple[WeightHandle, str] | None:
        """(handle, local path) of the newest version above the engine's, or None when there is none;
        after a failed fetch, counted and logged, the newest is read again for up to JOIN_FETCH_WAIT_S."""
        deadline = time.monotonic() + JOIN_FETCH_WAIT_S
        while True:
            newest = await self.loader.latest()
            if newest is None or newest.version <= self.version:
                return None
            try:
                return newest, await self.loader.fetch(newest)
            except WeightStoreError as exc:
                if time.monotonic() >= deadline:
                    raise
                self.count("join_fetch_failed")
                retry_for = round(deadline - time.monotonic(), 1)
                self.log.warning("weights_fetch_failed", error=str(exc), retry_for_s=retry_for)
                await self.loader.wait_for_publish(JOIN_RETRY_WAIT_S)

    async def _watch(self) -> None:
        poll = self.cfg.weights_poll_s
        while True:
            try:
                newest = await self.loader.latest()
                if newest is not None and newest.version > self.version:
                    seen = time.time()
                    path = await self.loader.fetch(newest)  # prefetch: generation keeps running
                    # Before the pause: publish -> noticed (the poll) and the prefetch.
                    lead = {"notice_s": round(seen - newest.created_at, 4), "fetch_s": round(time.time() - seen, 4)}
                    if not await self.switch_within(newest, path, self.cfg.switch_timeout_s, lead):
                        return
            except WeightStoreError as exc:
                self.log.warning("weights_fetch_failed", error=str(exc))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.log.exception("weights_switch_failed", error=repr(exc))
                if is_engine_dead(exc):
                    self.fatal = exc
                    return
            try:  # a publish wakes this at once; `poll` bounds the wait
                await self.loader.wait_for_publish(poll)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.log.warning("weights_wait_failed", error=repr(exc))
                await asyncio.sleep(poll)

    async def switch_within(self, handle: WeightHandle, path: str, timeout: float, lead: dict | None = None) -> bool:
        """`switch`, or on a hang past `timeout` mark the engine broken (the generator's step then
        raises, the worker exits and is restarted). asyncio.wait, not wait_for: a stuck call may not unwind."""
        task = asyncio.ensure_future(self.switch(handle, path, lead=lead))
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if done:
            task.result()
            return True
        task.cancel()
        self.fatal = RuntimeError(
            f"switching to weights version {handle.version} (pause, load, resume) did not finish in "
            f"{timeout:g}s; the vLLM engine looks stuck, so this generator exits to be restarted "
            f"(raise generator.switch_timeout_s if loading this model legitimately takes longer)"
        )
        self.log.error("weights_switch_hung", policy_version=handle.version, timeout_s=timeout)
        return False

    async def switch(self, handle: WeightHandle, path: str, joining: bool = False, lead: dict | None = None) -> None:
        """Pause (keep running requests), drain their delivered tokens, reload, resume; with LoRA
        only add the new adapter (running requests keep theirs)."""
        t0 = time.monotonic()
        marks: list[tuple[str, float]] = []
        if handle.is_adapter != (self.lora is not None):
            self.fatal = kind_mismatch(handle.version, handle.is_adapter)
            raise self.fatal
        if self.lora is not None:  # no pause: requests started from now on use the new adapter
            await self.settled()  # the previous version's folder is complete first
            await self.lora.switch(
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
            kv_cache=self.cfg.switch_kv_cache,
            active_requests=self.requests.active,
            joining=joining,
        )
        async with self._version_cond:
            self._version_cond.notify_all()

    async def settled(self) -> None:
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
            streams = self.requests.streams
            try:
                counts = self.engine.token_counts(list(streams))
            except FatalError as exc:  # every later switch would fail the same way: the worker exits
                self.fatal = exc
                raise
            for request_id, stream in streams.items():
                made = counts[request_id]
                stream.switch_at(len(stream.token_ids) if made is None else made, handle.version)
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
            before = self.requests.deliveries
            await asyncio.sleep(quiet_s)
            quiet = quiet + 1 if self.requests.deliveries == before else 0
