"""The trainer's assembler: join rollouts with their required annotations into complete groups,
apply the staleness bound, compute group advantages, and hand out batches.

Runs inside trainer rank 0 (workers/trainer.py). Reads `rollouts` and `annotations` with the
consumer group "trainer"; acks a batch's entries only after the step that used them (commit),
and a dropped/failed group's entries as soon as it is dropped. Redeliveries are idempotent:
a rollout id or (rollout id, key) seen twice is acked and ignored.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from streamrl.advantages import batch_advantages, overlong_penalty
from streamrl.batch import Batch
from streamrl.broker import Broker, Keys
from streamrl.config import Config
from streamrl.messages import Annotation, Prompt, Rollout, encode
from streamrl.staleness import is_stale
from workers.annotations import JoinPolicy

GROUP = "trainer"


@dataclass
class _Group:
    group_id: str
    group_size: int
    rollouts: dict[str, tuple[str, Rollout]] = field(default_factory=dict)
    """rollout_id -> (entry id, rollout)."""
    completed_at: float = 0.0
    full_at: float = 0.0
    """When its last rollout arrived: external annotation timeouts count from here."""


class Assembler:
    def __init__(self, cfg: Config, broker: Broker, owner, consumer: str = "trainer-0"):
        """`owner` is the trainer Worker: it decodes entries (dead-lettering bad ones) and logs."""
        self.cfg = cfg
        self.broker = broker
        self.owner = owner
        self.keys = Keys(cfg.run.name)
        self.consumer = consumer
        self.required = cfg.required_annotations()
        self.join = JoinPolicy(cfg)
        self.groups: dict[str, _Group] = {}
        self.annotations: dict[str, dict[str, tuple[str, Annotation]]] = {}
        self.ready: list[str] = []
        self.closed: set[str] = set()
        self.counters = {"dropped_stale": 0, "requeued": 0, "failed": 0, "filtered": 0, "duplicates": 0, "late": 0,
                         "dropped_timeout": 0, "annotation_timeouts": 0}

    async def start(self) -> None:
        for stream in (self.keys.rollouts, self.keys.annotations):
            await self.broker.ensure_group(stream, GROUP)

    # -- intake ----------------------------------------------------------------------------
    async def poll(self) -> int:
        """Read what is available (own pending first, then new) and file it. Returns entries read."""
        n = 0
        for stream, kind in ((self.keys.rollouts, Rollout), (self.keys.annotations, Annotation)):
            for entry, msg in await self.owner.read(stream, GROUP, count=512, expect=kind):
                n += 1
                if kind is Rollout:
                    await self._add_rollout(entry.id, msg)
                else:
                    await self._add_annotation(entry.id, msg)
        return n

    async def _add_rollout(self, entry_id: str, r: Rollout) -> None:
        if r.group_id in self.closed:
            self.counters["late"] += 1
            await self.broker.ack(self.keys.rollouts, GROUP, [entry_id])
            return
        g = self.groups.setdefault(r.group_id, _Group(r.group_id, r.group_size))
        if r.rollout_id in g.rollouts:
            self.counters["duplicates"] += 1
            await self.broker.ack(self.keys.rollouts, GROUP, [entry_id])
            return
        g.rollouts[r.rollout_id] = (entry_id, r)
        await self._check_group(g)

    async def _add_annotation(self, entry_id: str, a: Annotation) -> None:
        group_id = a.rollout_id.rsplit(":", 1)[0]
        slot = self.annotations.setdefault(a.rollout_id, {})
        if group_id in self.closed or a.key in slot:
            self.counters["late" if group_id in self.closed else "duplicates"] += 1
            await self.broker.ack(self.keys.annotations, GROUP, [entry_id])
            if group_id in self.closed and not slot:
                self.annotations.pop(a.rollout_id, None)
            return
        slot[a.key] = (entry_id, a)
        if a.error and self.join.on_error(a.key) != "default":
            await self._close(group_id, "failed", reason=f"{a.key}: {a.error}")
            return
        g = self.groups.get(group_id)
        if g is not None:
            await self._check_group(g)

    async def _check_group(self, g: _Group) -> None:
        if g.completed_at or len(g.rollouts) < g.group_size:
            return
        g.full_at = g.full_at or time.time()
        if self.join.missing(list(g.rollouts), self.annotations):
            return
        g.completed_at = time.time()
        if self.cfg.loss.dynamic_sampling and np.ptp(self._rewards(g)) == 0:
            # DAPO dynamic sampling: a group with equal rewards has zero advantage; drop it and let
            # the feeder admit a replacement, so the batch is refilled with informative groups.
            await self._close(g.group_id, "filtered")
            return
        self.ready.append(g.group_id)

    def _ordered(self, g: _Group) -> list[Rollout]:
        return [r for _, r in sorted(g.rollouts.values(), key=lambda er: er[1].sample)]

    def _rewards(self, g: _Group) -> np.ndarray:
        """Rewards of a group's rollouts in sample order, with DAPO's soft overlong penalty if configured."""
        rollouts = self._ordered(g)
        rewards = self.join.combine(self._components(g))
        loss = self.cfg.loss
        if loss.overlong_buffer > 0:
            lengths = np.asarray([len(r.completion_ids) for r in rollouts])
            rewards = rewards + overlong_penalty(lengths, self.cfg.generator.max_tokens, loss.overlong_buffer,
                                                 loss.overlong_penalty).astype(np.float32)
        return rewards

    def _components(self, g: _Group) -> dict[str, np.ndarray]:
        """Each reward key's values (built-in `reward`, external keys) in sample order."""
        return self.join.components([{k: a for k, (_, a) in self.annotations[r.rollout_id].items()}
                                     for r in self._ordered(g)])

    async def _expire(self) -> None:
        """Apply annotations.external timeouts to groups whose rollouts are all in (workers/annotations.py)."""
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
        return r_ids, a_ids

    async def _ack_group(self, group_id: str) -> None:
        r_ids, a_ids = self._entry_ids(group_id)
        if r_ids:
            await self.broker.ack(self.keys.rollouts, GROUP, r_ids)
        if a_ids:
            await self.broker.ack(self.keys.annotations, GROUP, a_ids)
        g = self.groups.pop(group_id, None)
        for rid in (g.rollouts if g else {}):
            self.annotations.pop(rid, None)
        self.closed.add(group_id)

    async def _close(self, group_id: str, why: str, reason: str = "") -> None:
        """Drop a group for good: ack its entries and release its admission slot."""
        g = self.groups.get(group_id)
        if why == "stale" and self.cfg.rollout.stale_policy == "requeue" and g and g.rollouts:
            await self._requeue(g)
            self.counters["requeued"] += 1
        else:
            self.counters["dropped_stale" if why == "stale" else why] += 1
            await self.broker.incr(self.keys.groups_released)
        if reason:
            self.owner.log.warning("group_dropped", group_id=group_id, why=why, reason=reason)
        if group_id in self.ready:
            self.ready.remove(group_id)
        await self._ack_group(group_id)

    async def _requeue(self, g: _Group) -> None:
        r = next(iter(g.rollouts.values()))[1]
        version = int(await self.broker.get(self.keys.trainer_version) or 0)
        prompt = Prompt(group_id=f"{g.group_id}r{self.counters['requeued'] + 1}", prompt_ids=r.prompt_ids,
                        group_size=g.group_size, admitted_version=version, text=r.prompt_text, meta=r.meta)
        await self.broker.add(self.keys.prompts, encode(prompt))

    # -- batches -----------------------------------------------------------------------------
    async def next_batch(self, version: int, stop=None) -> Batch | None:
        """Wait until `groups_per_step` fresh complete groups exist; None if `stop()` turns true first."""
        need = self.cfg.rollout.groups_per_step
        t0 = time.time()
        while True:
            await self._expire()
            for gid in list(self.ready):
                g = self.groups[gid]
                oldest = min(r.oldest_version() for _, r in g.rollouts.values())
                if is_stale(version, oldest, self.cfg.rollout.max_staleness):
                    await self._close(gid, "stale")
            if len(self.ready) >= need:
                break
            if stop is not None and stop():
                return None
            await self.poll()
        gids, self.ready = self.ready[:need], self.ready[need:]
        return self._build(gids, version, wait_s=time.time() - t0)

    def _build(self, gids: list[str], version: int, wait_s: float) -> Batch:
        rollouts, gidx, rewards, refs, parts = [], [], [], [], []
        for i, gid in enumerate(gids):
            g = self.groups[gid]
            ordered = self._ordered(g)
            rollouts += ordered
            gidx += [i] * len(ordered)
            rewards.append(self._rewards(g))
            parts.append(self._components(g))
            if "ref_logprobs" in self.required:
                refs += [np.asarray(self.annotations[r.rollout_id]["ref_logprobs"][1].value, np.float32)
                         for r in ordered]
        rewards = np.concatenate(rewards)
        rewards_a = np.asarray(rewards, dtype=np.float32)
        gidx_a = np.asarray(gidx, dtype=np.int64)
        oldest = np.asarray([r.oldest_version() for r in rollouts], dtype=np.int64)
        batch = Batch(
            rollouts=rollouts,
            group_index=gidx_a,
            rewards=rewards_a,
            advantages=batch_advantages(rewards_a, gidx_a, self.cfg.loss.advantage).astype(np.float32),
            ref_logprobs=refs if refs else None,
            staleness=version - oldest,
            reward_components={k: np.concatenate([p[k] for p in parts]) for k in self.join.reward_keys},
            stats={"wait_s": wait_s, **{k: float(v) for k, v in self.counters.items()}},
            group_ids=list(gids),
        )
        if self.cfg.loss.overlong_filter:
            batch.loss_mask = np.asarray([r.finish_reason != "length" for r in rollouts], dtype=np.float32)
        return batch

    async def commit(self, batch: Batch) -> None:
        """Ack a trained batch's entries (its effect, the optimizer step, is done)."""
        for gid in batch.group_ids:
            await self._ack_group(gid)
