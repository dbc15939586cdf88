"""Policy-gradient objectives: a registry of per-token loss functions, and the aggregation that
makes gradients of micro-batched, data-parallel training exact.

    from streamrl.losses import LossInputs, compute_loss, loss_requirements
    loss, metrics = compute_loss(cfg.loss, LossInputs(logprobs, old_logprobs, adv, mask, ...))
    loss.backward()          # once per micro-batch; FSDP then averages over ranks

Importing this package does not import torch; an objective's module (which declares its settings,
streamrl/losses/settings.py) is imported the first time the objective is resolved or used.
docs/losses.md has the formulas and shows how to add an objective in one file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamrl.losses.inputs import LossInputs
from streamrl.losses.registry import (
    BUILTIN_LOSSES,
    INPUT_NAMES,
    USER_LOSS,
    Objective,
    available_losses,
    check_loss_name,
    get_objective,
    known_losses,
    load_user_loss,
    loss_requirements,
    loss_settings,
    register_loss,
    resolve_loss,
)
from streamrl.losses.settings import ClipSettings, LossSettings, PPOSettings

if TYPE_CHECKING:
    import torch

    from streamrl.config.schema import LossConfig

__all__ = [
    "LossInputs",
    "compute_loss",
    "loss_requirements",
    "register_loss",
    "available_losses",
    "known_losses",
    "check_loss_name",
    "LossSettings",
    "ClipSettings",
    "PPOSettings",
    "loss_settings",
    "resolve_loss",
    "get_objective",
    "load_user_loss",
    "BUILTIN_LOSSES",
    "INPUT_NAMES",
    "USER_LOSS",
    "Objective",
]


def compute_loss(cfg: LossConfig, inp: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """One micro-batch's loss (call .backward() on it) and its metric contributions.

    Summing backward() over all micro-batches of all ranks, then averaging over dp_world_size
    ranks, gives exactly the gradient of the global objective; metrics sum to global values.
    `cfg`: resolve_loss(config) once per job (a bare LossConfig is resolved on each call, without
    the fixed horizon's generator.max_tokens default).
    """
    cfg = loss_settings(cfg)
    obj = get_objective(cfg.name)
    from streamrl.losses import core  # torch is imported only once a loss is computed

    return core.run(cfg, inp, obj)
