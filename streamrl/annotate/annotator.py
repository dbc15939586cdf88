"""One annotator loop for every role that reads `rollouts` and writes one annotation per rollout
(the reward worker, the reference worker, an SDK producer).

    class MyScorer(Annotator):
        key, group = "judge", "judge"
        async def annotate(self, rollouts):           # [(value, error)], [(value, error, parts)] or [(value, error, parts, text)]
            return [(await self.calls.run(score, r, timeout=5.0), "") for r in rollouts]

Blocking calls run on `self.calls` (streamrl/core/calls.py, `Calls`): a hung call times out at its
deadline and holds up neither later calls nor the stop.
"""

from __future__ import annotations

from streamrl.core.broker import Entry
from streamrl.core.calls import Calls
from streamrl.core.messages import Annotation, Rollout, encode
from streamrl.core.worker import Worker


class Annotator(Worker):
    """The loop: read a batch of `rollouts` with consumer group `group`, drop what `skip` names
    (acked, no annotation), `annotate` the rest, write one `key` annotation per rollout (errors are
    dead-lettered as well), then ack."""

    key: str = ""
    group: str = ""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = Calls(self.role)

    def batch_size(self) -> int:
        return 64

    def skip(self, rollout: Rollout) -> bool:
        return False

    async def annotate(self, rollouts: list[Rollout]) -> list[tuple]:
        """[(value, error)], [(value, error, parts)] or [(value, error, parts, text)] per rollout, in order."""
        raise NotImplementedError

    async def step(self) -> bool:
        # One partition per step (streamrl.core.broker.Keys): its batch is published and acked in one
        # call; the read blocks on every partition, so entries of the others are ready for the next steps.
        stream = self.consumer.pick(self.keys.rollout_streams)
        items = await self.read(stream, self.group, count=self.batch_size(), expect=Rollout)
        if not items:
            return False
        if skipped := [e.id for e, r in items if self.skip(r)]:
            await self.broker.ack(stream, self.group, skipped)
            items = [(e, r) for e, r in items if not self.skip(r)]
            if not items:
                return True
        results = await self.annotate([r for _, r in items])
        await self.publish(items, results, stream)
        return True

    def dead_letter_reason(self, error: str) -> str:
        return error

    async def publish(self, items: list[tuple[Entry, Rollout]], results: list, stream: str) -> None:
        """Write one `key` annotation per (entry, rollout) from `results` [(value, error)],
        [(value, error, parts)] or [(value, error, parts, text)], dead-letter the rollouts that failed (their annotation carries the
        error), then ack the batch. `stream`: the rollouts partition the batch was read from; the
        annotations go to the same partition."""
        out = []
        for (entry, r), (value, error, *rest) in zip(items, results, strict=True):
            if error:
                await self.dead_letter(stream, entry, self.dead_letter_reason(error))
            out.append(
                encode(
                    Annotation(
                        rollout_id=r.rollout_id,
                        key=self.key,
                        value=value,
                        producer=self.worker_id,
                        error=error,
                        parts=rest[0] if rest else {},
                        text=rest[1] if len(rest) > 1 else "",
                    )
                )
            )
        ids = [e.id for e, _ in items]
        annotations = self.keys.annotation_streams[self.keys.rollout_streams.index(stream)]
        await self.broker.add_and_ack(annotations, out, stream, self.group, ids)
        self.count("scored", len(items))

    async def close(self) -> None:
        self.calls.close()
