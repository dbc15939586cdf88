"""The trainer's rank step: the one function every trainer rank runs each step, as a torchrun script does.

    step = RankStep(engine, snapshot, checkpointer)
    result = step(StepOrder(version=3, batch=batch, snapshot=True, save=True))   # rank 0 (the worker)
    follow(step)                                                                # ranks > 0, until stopped

Rank 0 (workers/trainer.py) reads the batch from the broker and decides what the step does; the
order is broadcast (one collective of one object, so its shape is known on every rank) and then
every rank executes the same sequence of collectives from it: train, snapshot the weights,
start the checkpoint. A collective can only be added here, on every rank at once, so a rank can
never wait for a collective the others do not make.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from streamrl.core.batch import Batch
from streamrl.train.checkpoint import Checkpointer, PendingCheckpoint
from streamrl.train.dist import broadcast_object
from streamrl.train.engine_interface import TrainerEngine


@dataclass
class StepOrder:
    """What every rank does this step (decided on rank 0 from broker data, broadcast to all)."""

    version: int
    """The trainer version once this step is done (the checkpoint's version when saving)."""
    batch: Batch | None = None
    """Train one optimizer step on it (None: no training, e.g. republishing after a resume)."""
    snapshot: bool = False
    """Gather the weights for the weight store (rank 0 gets them)."""
    save: bool = False
    """Start checkpoint `version` (written in the background; rank 0 makes it visible later)."""


@dataclass
class StepResult:
    """One rank's outcome; metrics and state are rank 0's to use (other ranks get the same metrics)."""

    metrics: dict[str, float] | None = None
    state: object = None
    """What the weight store's snapshot returned (None on ranks > 0)."""
    pending: PendingCheckpoint | None = None
    train_start: float = 0.0
    """Wall-clock times around the optimizer step (time.time())."""
    train_end: float = 0.0
    snapshot_s: float = 0.0
    """Seconds the snapshot took: the training loop's only publishing cost."""


class RankStep:
    """One rank's step executor: `step(order)` on rank 0, `step(None)` on the others (receives it)."""

    def __init__(self, engine: TrainerEngine, snapshot: Callable[[TrainerEngine], object], checkpointer: Checkpointer):
        self.engine = engine
        self.snapshot = snapshot
        """Collective weight gather of the configured weight store (WeightPublisher.snapshot)."""
        self.checkpointer = checkpointer

    def __call__(self, order: StepOrder | None) -> StepResult | None:
        """Run rank 0's order on this rank; None (the stop order) finishes the checkpoint writes."""
        order = broadcast_object(order)
        if order is None:
            self.checkpointer.close()
            return None
        out = StepResult()
        if order.batch is not None:
            out.train_start = time.time()
            out.metrics = self.engine.train_step(order.batch)
            out.train_end = time.time()
            # After the first optimizer step (the optimizer state exists) the checkpoint's staging
            # buffers take its structure from the pool allocated at start-up (Checkpointer.prepare).
            self.checkpointer.prepare(self.engine)
        if order.snapshot:
            t0 = time.perf_counter()
            out.state = self.snapshot(self.engine)
            out.snapshot_s = time.perf_counter() - t0
        if order.save:
            # meta.json's broker snapshot is rank 0's to fill in (PendingCheckpoint.meta) before it
            # finalizes the checkpoint; no rank needs it for the collective write.
            out.pending = self.checkpointer.start(self.engine, order.version, {})
        return out

    def stop(self) -> None:
        """Rank 0: release the other ranks (they finish their checkpoint writes first)."""
        self(None)


def follow(step: RankStep) -> None:
    """Ranks > 0: run rank 0's orders until it sends the stop order."""
    while step(None) is not None:
        pass
