"""The trainer's half of evaluation: collect eval rollouts and their `reward` annotations by round,
compute the round's metrics once every completion is scored, ack, and hand them to the trainer.

    collector = EvalCollector(cfg, broker, keys)                  # inside the Assembler
    if collector.owns(msg): await collector.add(stream, entry_id, msg)
    rec.update(collector.take())                                  # next metrics.jsonl row gets eval/*

Eval entries never reach the assembler's groups, a batch, the step ledger or the admission counts
(streamrl/eval/rounds.py has the protocol). Only the `reward` annotation is used; other keys of eval
rollouts (ref_logprobs, external producers) are acked on arrival. A redelivered rollout (same
group and sample) or anything for a round already reported is acked and ignored. A round's state
is in memory: after a trainer restart its un-acked entries are read again and the round re-forms.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from streamrl.core.messages import Annotation, Rollout, eval_group_of, parse_eval_group
from streamrl.eval.rounds import EvalSample, answer_key, counted_reward, round_record

GROUP = "trainer"


@dataclass
class _Round:
    version: int
    prompts: int
    rollouts: dict[tuple[int, int], tuple[str, Rollout]] = field(default_factory=dict)
    """(prompt index, sample) -> (entry id, rollout)."""
    entries: dict[str, list[str]] = field(default_factory=dict)
    """Every entry id of this round still to ack, per stream (rollouts and annotations partitions)."""


class EvalCollector:
    def __init__(self, cfg, broker, keys):
        self.cfg, self.broker, self.keys = cfg, broker, keys
        self.rounds: dict[int, _Round] = {}
        self.rewards: dict[str, tuple[str, Annotation]] = {}
        """rollout id -> (entry id, its `reward` annotation), for rollouts of open rounds."""
        self.done: set[int] = set()
        self.finished: list[dict] = []
        """Metrics of reported rounds not yet written, oldest first."""

    def owns(self, msg) -> bool:
        rid = msg.rollout_id if isinstance(msg, (Rollout, Annotation)) else ""
        return eval_group_of(rid) is not None

    async def add(self, stream: str, entry_id: str, msg) -> None:
        group = eval_group_of(msg.rollout_id)
        version, prompts, index = parse_eval_group(group)
        rnd = None if version in self.done else self.rounds.setdefault(version, _Round(version, prompts))
        if isinstance(msg, Rollout):
            key = (index, msg.sample)
            if rnd is None or key in rnd.rollouts or msg.group_size != self.cfg.eval.samples:
                await self.broker.ack(stream, GROUP, [entry_id])  # late, redelivered or not this run's shape
                return
            rnd.rollouts[key] = (entry_id, msg)
            rnd.entries.setdefault(stream, []).append(entry_id)
        else:
            if rnd is None or msg.key != "reward" or msg.rollout_id in self.rewards:
                await self.broker.ack(stream, GROUP, [entry_id])
                return
            self.rewards[msg.rollout_id] = (entry_id, msg)
            rnd.entries.setdefault(stream, []).append(entry_id)
        await self._check(rnd)

    async def _check(self, rnd: _Round) -> None:
        n = self.cfg.eval.samples
        if len(rnd.rollouts) < rnd.prompts * n:
            return
        if any(r.rollout_id not in self.rewards for _, r in rnd.rollouts.values()):
            return
        scored = []
        for (i, s), (_, r) in rnd.rollouts.items():
            a = self.rewards[r.rollout_id][1]
            reward = counted_reward(a.value, a.error, self.cfg.reward)
            scored.append(
                EvalSample(
                    i, s, reward, answer_key(r.text, r.meta), bool(a.error), r.oldest_version(), len(r.completion_ids)
                )
            )
        rec = round_record(rnd.version, rnd.prompts, scored, self.cfg.eval)
        # An older round still open will not complete (e.g. a generator dead-lettered one of its
        # prompts): drop it so its entries do not stay pending (and block trimming) forever.
        older = [v for v in self.rounds if v < rnd.version]
        rec["eval/rounds_abandoned"] = len(older)
        for v in [*older, rnd.version]:
            await self._close(self.rounds[v])
        self.finished.append(rec)

    async def _close(self, rnd: _Round) -> None:
        """Ack every entry of a round and forget it; later entries of it are acked on arrival."""
        for stream, ids in rnd.entries.items():
            if ids:
                await self.broker.ack(stream, GROUP, ids)
        for rid in [rid for rid in self.rewards if parse_eval_group(eval_group_of(rid))[0] == rnd.version]:
            del self.rewards[rid]
        del self.rounds[rnd.version]
        self.done.add(rnd.version)

    def take(self) -> dict:
        """The oldest reported round's metrics (one per metrics row), or {}."""
        return self.finished.pop(0) if self.finished else {}

    def take_all(self) -> dict:
        """Every reported round merged, the newest winning (the last metrics row)."""
        out: dict = {}
        while self.finished:
            out.update(self.finished.pop(0))
        return out

    def has(self, version: int) -> bool:
        """Whether the round issued at `version` is over (reported, or abandoned for a newer one)."""
        return version in self.done
