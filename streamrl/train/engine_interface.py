"""What the trainer, its checkpoints and the weight publisher need of a trainer engine (the `hf` and
`torchtitan` backends both implement it; streamrl/train/engines.make_engine picks one).

    engine = make_engine(cfg, model_path, rank, world)     # a TrainerEngine, built on every rank
    metrics = engine.train_step(batch)                      # collective: every rank, the same batch
    state = engine.full_state_dict()                        # collective: HF-named CPU copies on rank 0
    stream = engine.weight_stream()                         # collective: one full tensor at a time

Every method that touches weights is collective: all ranks call it in the same order (the trainer's
rank step, streamrl/train/rank_step.py, guarantees that).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor

from streamrl.config.schema import Config
from streamrl.core.batch import Batch
from streamrl.weights.store import WeightStream


class TrainerEngine(ABC):
    """One rank's model + optimizer. Subclasses set the attributes below in __init__."""

    cfg: Config
    rank: int
    world_size: int
    dp_rank: int
    """This rank's data-parallel coordinate: the shard of each batch it trains on."""
    dp_size: int
    dp_group: object | None
    """Process group metrics are summed over (None: all ranks)."""
    device: torch.device
    pad_id: int
    vocab_size: int | None
    """Rows the LM head scores (token ids at or above it are invalid); None where unknown."""
    model: torch.nn.Module
    """The sharded module (checkpoints save it through torch.distributed.checkpoint)."""
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    steps_done: int
    """Optimizer steps applied (a step skipped for a non-finite gradient does not count)."""

    @abstractmethod
    def train_step(self, batch: Batch) -> dict[str, float]:
        """One optimizer step on the whole batch (every rank passes the same full batch); collective."""

    @abstractmethod
    def full_state_dict(self) -> dict[str, Tensor] | None:
        """Full Hugging Face-named weights as detached CPU copies on rank 0, None elsewhere; collective."""

    def adapter_config(self) -> dict | None:
        """The PEFT adapter_config.json content when the engine trains a LoRA adapter (then
        full_state_dict holds only the adapter's tensors, under peft's names); None otherwise."""
        return None

    def checkpoint_options(self) -> dict:
        """Keyword arguments of torch.distributed.checkpoint's StateDictOptions for checkpoints
        (e.g. ignore_frozen_params: a frozen base is not saved); {} = the whole model."""
        return {}

    def weight_stream(self) -> WeightStream:
        """Full Hugging Face-named tensors one at a time, for a publisher that places them itself
        (streamrl.weights.store.WeightStream); collective. This default gathers the whole state first."""
        state = self.full_state_dict()
        if state is None:
            return WeightStream([], iter(()), receiver=False)
        layout = [(name, t.dtype, list(t.shape)) for name, t in state.items()]
        return WeightStream(layout, iter(state.values()), receiver=True)
