"""The trainer's assembler: join rollouts with their required annotations into complete groups,
apply the staleness bound, compute group advantages, and hand out batches.

Runs inside trainer rank 0 (workers/trainer.py). Reads `rollouts` and `annotations` with the
consumer group "trainer"; acks a batch's entries only after the step that used them (commit),
and a dropped/failed group's entries as soon as it is dropped. Redeliveries are idempotent:
a rollout id or (rollout id, key) seen twice is acked and ignored.

Copies and unknown ids (docs/protocol.md, "Annotation semantics"): a rollout id names one
generated completion. Per (group, sample) the first copy read (the lowest entry id) is trained;
a later copy (the sample was generated again) and its annotations are acked as `duplicates`. An
annotation whose rollout has not been read yet is held; once a read of `rollouts` comes back
short (every rollout added before it was delivered) a held annotation still without its rollout
names none: it is acked and counted in `unknown_annotations`, so it never holds back trimming.

Intake (`poll`: read, decode, validate, join) runs where the batches are asked for, or, after
`start_intake()`, in a background task that keeps reading while the trainer trains (the train
step runs in a thread), so a step's wait for its batch is not also the time to decode and join
everything that arrived during the previous step. `_state` serialises the filing of entries with
the closing, building and acking of groups.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

import numpy as np

from streamrl.assemble.advantages import batch_advantages
from streamrl.assemble.failure_streak import FailureStreak, GeneratorFailures
from streamrl.assemble.group_rewards import annotation_texts, group_components, group_rewards, reward_errors
from streamrl.assemble.join_policy import JoinPolicy
from streamrl.assemble.pending_group import PendingGroup, rollout_problem
from streamrl.assemble.placement import misplaced
from streamrl.config.schema import Config
from streamrl.core.accounting import close_group
from streamrl.core.batch import Batch
from streamrl.core.broker import Broker, Entry, Keys
from streamrl.core.consumer import StreamConsumer
from streamrl.core.messages import Annotation, Prompt, Rollout, encode, parse_rollout_id
from streamrl.core.staleness import due_first, is_stale
from streamrl.eval.collector import EvalCollector
from streamrl.losses import resolve_loss

GROUP = "trainer"


class Assembler:
    def __init__(self, cfg: Config, broker: Broker, log, count: Callable[..., None], consumer: str = "trainer-0"):
        """`log` (a structlog logger) and `count(name, by)` are the trainer's: the assembler's warnings go
        to its log, its reads' `dead_lettered` to its counters (Worker.log, Worker.count)."""
        self.cfg = cfg
        self.broker = broker
        self.log = log
        self.keys = Keys.of(cfg, broker)
        self.consumer = consumer
        self.reader = StreamConsumer(broker, cfg.broker, consumer, self.keys, log, count)
        """The trainer group's reads of `rollouts` and `annotations` (one consumer: `consumer`)."""
        self.required = cfg.required_annotations()
        self.join = JoinPolicy(cfg)
        self.loss = resolve_loss(cfg)  # the objective's defaults: dapo samples dynamically, dr_grpo uses group_mean
        self.streak = FailureStreak(cfg)
        """Failed groups in a row: past the bound it raises FatalError (the trainer stops the job)."""
        self.generator_failures = GeneratorFailures(broker, self.keys, self.streak)
        """Groups the generators gave up, read from the broker into the streak."""
        self.groups: dict[str, PendingGroup] = {}
        self.annotations: dict[str, dict[str, tuple[str, Annotation]]] = {}
        """rollout_id (of a trained copy) -> key -> (entry id, annotation)."""
        self.held: dict[str, dict[str, list[tuple[str, Annotation]]]] = {}
        """group_id -> rollout_id -> [(entry id, annotation)]: annotations whose rollout is not read yet
        (all of them: which one is valid for the rollout can only be told once it is read)."""
        self.ready: list[str] = []
        self.closed: set[str] = set()
        self.replay: set[str] = set()
        """Groups of logged steps a resumed trainer retrains exactly as logged (no filter, no staleness drop)."""
        self._rescanned = time.monotonic()
        self._unused_keys: set[str] = set()
        self.vocab_size: int | None = None
        """Token ids at or above it are dead-lettered (the trainer's embedding would fail on them)."""
        self.evals = EvalCollector(cfg, broker, self.keys)
        """Eval rounds (streamrl/eval/rounds.py): their entries go there, never into a group or a batch."""
        self._state = asyncio.Lock()
        self._reading = asyncio.Lock()
        self._intake: asyncio.Task | None = None
        self._intake_stop = False
        self._polls = 0
        """Polls completed by the intake task; `_polled` is set (and replaced) at each one."""
        self._polled = asyncio.Event()
        self.counters = {
            "dropped_stale": 0,
            "requeued": 0,
            "failed": 0,
            "filtered": 0,
            "duplicates": 0,
            "late": 0,
            "dropped_timeout": 0,
            "annotation_timeouts": 0,
            "annotation_errors": 0,
            "unknown_annotations": 0,
        }

    async def start(self) -> None:
        for stream in self.keys.rollout_streams + self.keys.annotation_streams:
            await self.broker.ensure_group(stream, GROUP)
            # One consumer (trainer rank 0) reads this group: adopt what an earlier trainer process
            # under another id left pending; our own pending entries are then read first (no idle
            # claiming later, which would hand our own waiting entries back to us as duplicates).
            await self.broker.claim_idle(stream, GROUP, self.consumer, 0, count=100_000)

    def restore(self, closed: set[str], replay: set[str]) -> None:
        """After a resume: groups with a final outcome are closed; `replay` groups are retrained as logged."""
        self.closed |= closed
        self.replay = set(replay)

    # -- intake ----------------------------------------------------------------------------
    async def poll(self) -> int:
        """Read what is available (own pending first, then new) and file it. Returns entries read."""
        async with self._reading:
            return await self._poll()

    async def _poll(self) -> int:
        n = 0
        await self.generator_failures.read()
        if time.monotonic() - self._rescanned > self.cfg.broker.claim_idle_ms / 1000:
            # Re-read our own pending entries now and then: after a broker restart, entries whose
            # XREADGROUP reply was lost are pending on us but were never seen (nobody else claims them).
            self._rescanned = time.monotonic()
            self.reader.rescan(*self.keys.rollout_streams, *self.keys.annotation_streams)
        # Partition by partition (streamrl.core.broker.Keys); each read blocks on every stream of the
        # group, so what arrives on another partition meanwhile is read ahead, not waited for.
        pairs = zip(self.keys.rollout_streams, self.keys.annotation_streams)
        for stream, kind in [(s, kind) for r, a in pairs for s, kind in ((r, Rollout), (a, Annotation))]:
            # Annotations held before this partition's rollouts are read: if that read catches up,
            # their rollouts were added before it (a rollout precedes its annotations), so never will be.
            before = self._held_in(stream) if kind is Rollout else set()
            items = await self.reader.read(stream, GROUP, count=512, expect=kind, claim=False)
            async with self._state:
                for entry, msg in items:
                    n += 1
                    if reason := self._invalid(msg) or self._misplaced(stream, msg):
                        await self.reader.dead_letter(stream, entry, reason)
                        await self.broker.ack(stream, GROUP, [entry.id])
                    elif self.evals.owns(msg):
                        await self.evals.add(stream, entry.id, msg)
                    elif kind is Rollout:
                        await self._add_rollout(entry.id, msg)
                    else:
                        await self._add_annotation(entry.id, msg)
                if kind is Rollout and self.reader.caught_up.get(stream):
                    await self._ack_unknown(before)
        return n

    def start_intake(self) -> None:
        """Keep polling in a background task (until `stop_intake`); batches then wait on its polls."""
        if self._intake is None:
            self._intake_stop = False
            self._intake = asyncio.create_task(self._intake_loop())

    async def stop_intake(self) -> None:
        """End the background intake after its current poll (a read blocks at most broker.block_ms):
        cancelling it mid-read would leave delivered entries unseen until the next rescan."""
        task, self._intake = self._intake, None
        if task is None:
            return
        self._intake_stop = True
        await asyncio.wait({task})
        if not task.cancelled() and task.exception() is not None:
            self.log.warning("intake_failed", error=repr(task.exception()))

    async def _intake_loop(self) -> None:
        try:
            while not self._intake_stop:
                await self.poll()
                self._polls += 1
                done, self._polled = self._polled, asyncio.Event()
                done.set()
        finally:
            self._polled.set()  # a waiter sees the task has ended (and its error, in advance)

    async def advance(self) -> None:
        """One round of intake: the background task's next poll if it runs (re-raising its error), else a poll."""
        task = self._intake
        if task is None:
            await self.poll()
            return
        seen, polled = self._polls, self._polled
        while self._polls == seen and not task.done():
            await polled.wait()
            polled = self._polled
        if task.done():
            self._intake = None
            task.result()  # its error (the FatalError of a failure streak, a broker error) is the caller's
            raise RuntimeError("the assembler's intake ended without an error while batches were asked for")

    def _misplaced(self, stream: str, msg) -> str:
        return misplaced(self.keys, stream, msg)

    def _invalid(self, msg) -> str:
        """Why a decodable message still cannot be used (it would break a group or the train step)."""
        if isinstance(msg, Rollout):
            return rollout_problem(msg, self.groups.get(msg.group_id), self.vocab_size)
        if parse_rollout_id(msg.rollout_id) is None:
            return (
                f"annotation {msg.key!r} from producer {msg.producer!r}: rollout_id {msg.rollout_id!r} is not "
                "'<group_id>:<sample>:<nonce>'; copy the rollout's rollout_id unchanged"
            )
        if self.join.shape(msg.key) is None and msg.key not in self._unused_keys:
            self._unused_keys.add(msg.key)  # accepted and ignored (docs/protocol.md); said once, it may be a typo
            self.log.warning(
                "unused_annotation_key",
                key=msg.key,
                producer=msg.producer,
                hint="list it in annotations.external to train on it",
            )
        return self.join.invalid(msg)

    async def _add_rollout(self, entry_id: str, r: Rollout) -> None:
        if r.group_id in self.closed:
            self.counters["late"] += 1
            await self.broker.ack(self.keys.rollouts_for(r.group_id), GROUP, [entry_id])
            return
        g = self.groups.setdefault(r.group_id, PendingGroup(r.group_id, r.group_size))
        if r.rollout_id in g.rollouts or r.rollout_id in g.superseded:
            if g.rollouts.get(r.rollout_id, ("",))[0] != entry_id:  # the same entry re-read is still needed
                self.counters["duplicates"] += 1
                await self.broker.ack(self.keys.rollouts_for(r.group_id), GROUP, [entry_id])
            return
        held = self.held.get(r.group_id, {}).pop(r.rollout_id, [])
        if r.sample in g.samples:
            # Another completion of a sample we already have (generated again after a crash): the
            # first copy read is trained; this one and every annotation computed for it are not.
            g.superseded.add(r.rollout_id)
            self.counters["duplicates"] += 1 + len(held)
            await self.broker.ack(self.keys.rollouts_for(r.group_id), GROUP, [entry_id])
            if held:
                await self.broker.ack(self.keys.annotations_for(r.group_id), GROUP, [eid for eid, _ in held])
            return
        g.rollouts[r.rollout_id] = (entry_id, r)
        g.samples[r.sample] = r.rollout_id
        for eid, a in held:
            if r.group_id in self.closed:  # an earlier held annotation failed the group
                self.counters["late"] += 1
                await self.broker.ack(self.keys.annotations_for(r.group_id), GROUP, [eid])
            else:
                await self._attach(g, eid, a)
        if r.group_id not in self.closed:
            await self._check_group(g, r.rollout_id)

    async def _add_annotation(self, entry_id: str, a: Annotation) -> None:
        group_id = parse_rollout_id(a.rollout_id)[0]
        g = self.groups.get(group_id)
        if group_id in self.closed or (g is not None and a.rollout_id in g.superseded):
            self.counters["late" if group_id in self.closed else "duplicates"] += 1
            await self.broker.ack(self.keys.annotations_for(group_id), GROUP, [entry_id])
        elif g is not None and a.rollout_id in g.rollouts:
            await self._attach(g, entry_id, a)
        else:
            held = self.held.setdefault(group_id, {}).setdefault(a.rollout_id, [])
            if all(eid != entry_id for eid, _ in held):  # the same entry re-read is held already
                held.append((entry_id, a))

    async def _attach(self, g: PendingGroup, entry_id: str, a: Annotation) -> None:
        """File an annotation of one of `g`'s trained copies: first per key wins, errors apply their policy."""
        slot = self.annotations.setdefault(a.rollout_id, {})
        if a.key in slot:
            if slot[a.key][0] != entry_id:
                self.counters["duplicates"] += 1
                await self.broker.ack(self.keys.annotations_for(g.group_id), GROUP, [entry_id])
            return
        if reason := self.join.mismatch(a, len(g.rollouts[a.rollout_id][1].completion_ids)):
            # The group waits for a good one (or its key's timeout).
            stream = self.keys.annotations_for(g.group_id)
            await self.reader.dead_letter(stream, Entry(entry_id, encode(a), {}), reason)
            await self.broker.ack(stream, GROUP, [entry_id])
            return
        slot[a.key] = (entry_id, a)
        if a.error:
            self.counters["annotation_errors"] += 1
            if self.join.on_error(a.key) != "default":
                await self._close(g.group_id, "failed", reason=f"{a.key}: {a.error}")
                return
        await self._check_group(g, a.rollout_id)

    def _held_in(self, rollouts: str) -> set[tuple[str, str, str]]:
        """(group id, rollout id, entry id) of the held annotations of the partition of `rollouts`."""
        return {
            (gid, rid, eid)
            for gid, rids in self.held.items()
            if self.keys.rollouts_for(gid) == rollouts
            for rid, held in rids.items()
            for eid, _ in held
        }

    async def _ack_unknown(self, before: set[tuple[str, str, str]]) -> None:
        """Every rollout of a partition added before its last read has been read: the annotations held
        since before that read (`before`, still held) name no rollout."""
        gone = [
            (gid, rid, eid, a) for gid, rid, eid in before for e, a in self.held.get(gid, {}).get(rid, []) if e == eid
        ]
        if not gone:
            return
        self.counters["unknown_annotations"] += len(gone)
        self.log.warning(
            "unknown_rollout_ids",
            annotations=len(gone),
            producers=sorted({a.producer for *_, a in gone})[:10],
            examples=sorted({rid for _, rid, _, _ in gone})[:5],
        )
        ids: dict[str, list[str]] = {}
        for gid, rid, eid, _ in gone:
            ids.setdefault(self.keys.annotations_for(gid), []).append(eid)
            held = self.held[gid][rid] = [(e, a) for e, a in self.held[gid][rid] if e != eid]
            if not held:
                del self.held[gid][rid]
            if not self.held[gid]:
                del self.held[gid]
        await self.broker.ack_many(GROUP, ids)

    async def _check_group(self, g: PendingGroup, changed: str = "") -> None:
        """Move `g` to `ready` if it is complete; `changed`: the rollout id whose entry was just filed."""
        if g.completed_at or len(g.rollouts) < g.group_size:
            return
        g.full_at = g.full_at or time.time()
        if changed and self.join.missing([changed], self.annotations):
            return  # that rollout still waits: the group does too (the whole-group check is per entry O(group))
        if self.join.missing(list(g.rollouts), self.annotations):
            return
        g.completed_at = time.time()
        if errors := reward_errors(g, self.annotations):  # reward.on_error=score: every rollout failed
            self.streak.failed(f"reward: {errors[0]}")
        else:
            self.streak.ok()
        if g.group_id in self.replay:
            self.ready.append(g.group_id)
            return
        if self.loss.dynamic_sampling and np.ptp(group_rewards(g, self.annotations, self.join, self.cfg)) == 0:
            # DAPO dynamic sampling: a group with equal rewards has zero advantage; drop it and let
            # the feeder admit a replacement, so the batch is refilled with informative groups.
            await self._close(g.group_id, "filtered")
            return
        self.ready.append(g.group_id)

    async def _expire(self) -> None:
        """Apply annotations.external timeouts to groups whose rollouts are all in (streamrl/assemble/join_policy.py)."""
        if not self.join.external:
            return  # only external keys have timeouts; skip the scan on the hot path
        now = time.time()
        for g in [g for g in self.groups.values() if g.full_at and not g.completed_at]:
            missing = self.join.missing(list(g.rollouts), self.annotations)
            verdict = self.join.verdict(missing, now - g.full_at)
            if verdict == "drop":
                await self._close(g.group_id, "dropped_timeout", reason=f"no {sorted(missing)} in time")
            elif verdict == "default":
                for rid in g.rollouts:  # stand-ins have no stream entry (""), so nothing to ack for them
                    slot = self.annotations.setdefault(rid, {})
                    for key in [k for k in missing if k not in slot]:
                        slot[key] = ("", self.join.stand_in(rid, key))
                        self.counters["annotation_timeouts"] += 1
                await self._check_group(g)

    # -- closing groups ----------------------------------------------------------------------
    def _entry_ids(self, group_id: str) -> tuple[list[str], list[str]]:
        g = self.groups.get(group_id)
        rids = list(g.rollouts) if g else []
        r_ids = [g.rollouts[r][0] for r in rids] if g else []
        a_ids = [eid for r in rids for eid, _ in self.annotations.get(r, {}).values() if eid]
        held = [eid for entries in self.held.get(group_id, {}).values() for eid, _ in entries]
        self.counters["late"] += len(held)  # for copies of samples not read yet: they will be late too
        return r_ids, a_ids + held

    async def _ack_group(self, *group_ids: str) -> None:
        """Ack every entry of these groups (both streams in one round trip) and forget them."""
        ids: dict[str, list[str]] = {}
        for group_id in group_ids:
            r, a = self._entry_ids(group_id)
            ids.setdefault(self.keys.rollouts_for(group_id), []).extend(r)
            ids.setdefault(self.keys.annotations_for(group_id), []).extend(a)
        # One round trip per partition's slot (one in all on a single server): on the trainer's critical path.
        await self.broker.ack_many(GROUP, ids)
        for group_id in group_ids:
            g = self.groups.pop(group_id, None)
            for rid in g.rollouts if g else {}:
                self.annotations.pop(rid, None)
            self.held.pop(group_id, None)
            self.closed.add(group_id)

    async def _close(self, group_id: str, why: str, reason: str = "") -> None:
        """Drop a group for good: ack its entries and release its admission slot."""
        g = self.groups.get(group_id)
        if why == "stale" and self.cfg.rollout.stale_policy == "requeue" and g and g.rollouts:
            await self._requeue(g)
            self.counters["requeued"] += 1
            await close_group(self.broker, self.keys, group_id, "requeued", release=False)
        else:
            self.counters["dropped_stale" if why == "stale" else why] += 1
            await close_group(self.broker, self.keys, group_id, "dropped_stale" if why == "stale" else why)
        if reason:
            self.log.warning("group_dropped", group_id=group_id, why=why, reason=reason)
        if group_id in self.ready:
            self.ready.remove(group_id)
        await self._ack_group(group_id)
        if why == "failed":
            self.streak.failed(reason)

    async def _requeue(self, g: PendingGroup) -> None:
        r = next(iter(g.rollouts.values()))[1]
        version = int(await self.broker.get(self.keys.trainer_version) or 0)
        # Deterministic id (streamrl.core.accounting counts `<id>r` as admitted): a retried requeue is idempotent.
        prompt = Prompt(
            group_id=f"{g.group_id}r",
            prompt_ids=r.prompt_ids,
            group_size=g.group_size,
            admitted_version=version,
            text=r.prompt_text,
            meta=r.meta,
        )
        await self.broker.add(self.keys.prompts, encode(prompt))

    # -- batches -----------------------------------------------------------------------------
    async def next_batch(self, version: int, stop=None) -> Batch | None:
        """Wait until `groups_per_step` fresh complete groups exist; None if `stop()` turns true first."""
        need = self.cfg.rollout.groups_per_step
        t0 = time.time()
        self.streak.step = version
        while True:
            async with self._state:
                await self._expire()
                for gid in list(self.ready):
                    g = self.groups[gid]
                    if g.oldest is None:
                        g.oldest = min(r.oldest_version() for _, r in g.rollouts.values())
                    if gid in self.replay:
                        continue
                    if is_stale(version, g.oldest, self.cfg.rollout.max_staleness):
                        await self._close(gid, "stale")
                if len(self.ready) >= need:
                    # Earliest deadline first, not arrival order: a group that finished after fresher
                    # ones (its generation was slower) still makes this step instead of going stale.
                    order = due_first([self.groups[gid].oldest for gid in self.ready])
                    gids = [self.ready[i] for i in order[:need]]
                    self.ready = [self.ready[i] for i in sorted(order[need:])]
                    return self._build(gids, version, wait_s=time.time() - t0)
            if stop is not None and stop():
                return None
            await self.advance()

    async def replay_batch(self, gids: list[str], version: int, stop=None) -> Batch | None:
        """The batch of a logged step, rebuilt from its still-pending entries (resume)."""
        t0 = time.time()
        while not all(gid in self.ready for gid in gids):
            if stop is not None and stop():
                return None
            await self.advance()
        async with self._state:
            self.ready = [g for g in self.ready if g not in gids]
            self.replay -= set(gids)
            return self._build(list(gids), version, wait_s=time.time() - t0)

    def _build(self, gids: list[str], version: int, wait_s: float) -> Batch:
        rollouts, gidx, rewards, refs, parts = [], [], [], [], []
        for i, gid in enumerate(gids):
            g = self.groups[gid]
            ordered = g.ordered()
            rollouts += ordered
            gidx += [i] * len(ordered)
            rewards.append(group_rewards(g, self.annotations, self.join, self.cfg))
            parts.append(group_components(g, self.annotations, self.join))
            if "ref_logprobs" in self.required:
                refs += [
                    np.asarray(self.annotations[r.rollout_id]["ref_logprobs"][1].value, np.float32) for r in ordered
                ]
        rewards = np.concatenate(rewards)
        rewards_a = np.asarray(rewards, dtype=np.float32)
        gidx_a = np.asarray(gidx, dtype=np.int64)
        oldest = np.asarray([r.oldest_version() for r in rollouts], dtype=np.int64)
        batch = Batch(
            rollouts=rollouts,
            group_index=gidx_a,
            rewards=rewards_a,
            advantages=batch_advantages(rewards_a, gidx_a, self.loss.advantage).astype(np.float32),
            ref_logprobs=refs if refs else None,
            staleness=version - oldest,
            reward_components={k: np.concatenate([p[k] for p in parts]) for k in parts[0]},
            stats={"wait_s": wait_s, **{k: float(v) for k, v in self.counters.items()}},
            group_ids=list(gids),
            annotation_texts=annotation_texts([self.annotations[r.rollout_id] for r in rollouts]),
        )
        if self.cfg.loss.overlong_filter:
            batch.loss_mask = np.asarray([r.finish_reason != "length" for r in rollouts], dtype=np.float32)
        return batch

    async def commit(self, batch: Batch) -> None:
        """Ack a trained batch's entries (its effect, the optimizer step, is done)."""
        async with self._state:
            await self._ack_group(*batch.group_ids)
