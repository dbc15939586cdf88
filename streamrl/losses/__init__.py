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

import importlib
import pkgutil
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable

from streamrl.advantages import dynamic_sampling_keep, overlong_penalty
from streamrl.errors import ConfigError
from streamrl.imports import import_spec

from streamrl.losses.settings import ClipSettings, LossSettings, loss_settings, resolve_loss

if TYPE_CHECKING:
    import torch

    from streamrl.config import LossConfig

__all__ = [
    "LossInputs", "compute_loss", "loss_requirements", "register_loss", "available_losses",
    "known_losses", "check_loss_name", "dynamic_sampling_keep", "overlong_penalty",
    "LossSettings", "ClipSettings", "loss_settings", "resolve_loss",
]

BUILTIN_LOSSES: dict[str, str] = {
    "grpo": "ppo",
    "dr_grpo": "ppo",
    "dapo": "ppo",
    "gspo": "gspo",
    "cispo": "cispo",
    "sapo": "sapo",
    "tis": "tis",
    "decoupled_ppo": "decoupled_ppo",
    "clipped_reinforce": "clipped_reinforce",
    "reinforce": "reinforce",
}
"""Objective name -> module of this package that registers it, so one objective is imported, not
all; a module missing here is still found (by importing every module)."""

INPUT_NAMES = ("ref_logprobs", "prox_logprobs", "entropy")


@dataclass(frozen=True)
class Objective:
    name: str
    fn: Callable[..., Any]
    """fn(cfg, inp) -> streamrl.losses.core.Terms (per-token loss, ratio, clip masks)."""
    requires: frozenset[str]
    """Optional LossInputs fields the objective itself needs (beyond what cfg implies)."""
    settings: type[LossSettings] = ClipSettings
    """Its settings: the parameters it reads from cfg and its defaults (streamrl/losses/settings.py)."""


_REGISTRY: dict[str, Objective] = {}
_USER_LOSSES: dict[str, Objective] = {}
"""`module:function` objectives loaded so far (kept apart: they are not names to list or register)."""


def register_loss(name: str, *, requires: Iterable[str] = (), settings: type[LossSettings] = ClipSettings) -> Callable:
    """Decorator: make `fn(cfg, inp) -> Terms` available as `loss.name=<name>`; `cfg` is an instance
    of `settings` (the objective's parameters and defaults, a LossSettings subclass)."""
    req = frozenset(requires)
    if not req <= set(INPUT_NAMES):
        raise ValueError(f"register_loss({name!r}): requires={sorted(req)} must be a subset of {INPUT_NAMES}")
    if not (isinstance(settings, type) and issubclass(settings, LossSettings)):
        raise ValueError(f"register_loss({name!r}): settings={settings!r} must be a streamrl.losses.LossSettings subclass")

    def deco(fn: Callable) -> Callable:
        old = _REGISTRY.get(name)
        if old is not None and (old.fn.__module__, old.fn.__qualname__) != (fn.__module__, fn.__qualname__):
            raise ValueError(
                f"loss {name!r} is already registered by {old.fn.__module__}.{old.fn.__qualname__}; "
                "pick another name for the new objective"
            )
        _REGISTRY[name] = Objective(name, fn, req, settings)
        return fn

    return deco


def _import_all() -> None:
    for mod in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{mod.name}")


def available_losses() -> list[str]:
    """Every registered objective (imports all objective modules, hence torch)."""
    _import_all()
    return sorted(_REGISTRY)


def known_losses() -> list[str]:
    """Objective names known without importing anything: the built-ins plus those registered."""
    return sorted(set(BUILTIN_LOSSES) | set(_REGISTRY))


USER_LOSS = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
"""`package.module:function`: an objective in the user's own module (loss.name), like reward.fn."""


def check_loss_name(name: str) -> None:
    """Raise ConfigError listing the objectives if `name` is not one (importless for built-ins).
    A `module:function` name is checked for syntax only: get_objective imports it."""
    if name in BUILTIN_LOSSES or name in _REGISTRY:
        return
    if ":" in name:
        if not USER_LOSS.fullmatch(name):
            raise ConfigError(f"loss.name={name!r} is not `package.module:function`; e.g. loss.name=my_losses:my_loss")
        return
    names = available_losses()  # a new module not yet listed in BUILTIN_LOSSES registers here
    if name not in names:
        raise ConfigError(f"unknown loss.name={name!r}; set loss.name to one of: {', '.join(names)}")


def load_user_loss(name: str) -> Objective:
    """Import `package.module:function` and load it as objective `name`. The function has the
    built-ins' signature, fn(cfg, inp: LossInputs) -> streamrl.losses.core.Terms; a `requires`
    attribute (e.g. ("prox_logprobs",)) asks for optional inputs, a `settings` attribute (a
    LossSettings subclass) declares its parameters; without one it gets ClipSettings (eps_low, eps_high)."""
    module_name, attr, fn = import_spec(name, f"loss.name={name!r}", "install it or put its directory on "
                                        "PYTHONPATH (every trainer rank imports it)")
    if not callable(fn):
        raise ConfigError(f"loss.name={name!r}: module {module_name!r} has no function {attr!r}; define "
                          "`def NAME(cfg, inp: streamrl.losses.LossInputs) -> streamrl.losses.core.Terms` there "
                          "(docs/losses.md, 'An objective in your own module')")
    requires = frozenset(getattr(fn, "requires", ()))
    if not requires <= set(INPUT_NAMES):
        raise ConfigError(f"loss.name={name!r}: {attr}.requires={sorted(requires)} must be a subset of {INPUT_NAMES}")
    settings = getattr(fn, "settings", ClipSettings)
    if not (isinstance(settings, type) and issubclass(settings, LossSettings)):
        raise ConfigError(f"loss.name={name!r}: {attr}.settings={settings!r} is not a subclass of "
                          "streamrl.losses.LossSettings; declare `class MySettings(LossSettings)` with your fields")
    _USER_LOSSES[name] = Objective(name, fn, requires, settings)
    return _USER_LOSSES[name]


def get_objective(name: str) -> Objective:
    if ":" in name:
        return _USER_LOSSES.get(name) or load_user_loss(name)
    if name not in _REGISTRY and name in BUILTIN_LOSSES:
        importlib.import_module(f"{__name__}.{BUILTIN_LOSSES[name]}")
    if name not in _REGISTRY:
        check_loss_name(name)
    return _REGISTRY[name]


def loss_requirements(cfg: LossConfig) -> set[str]:
    """Which optional LossInputs fields the trainer must fill for this config."""
    cfg = loss_settings(cfg)
    req = set(get_objective(cfg.name).requires)
    if cfg.kl_beta > 0:
        req.add("ref_logprobs")
    if cfg.entropy_coef > 0:
        req.add("entropy")
    return req


@dataclass
class LossInputs:
    logprobs: torch.Tensor
    """[B, T] current-policy log-probs of the completion tokens (requires grad)."""
    old_logprobs: torch.Tensor
    """[B, T] behaviour (sampling) log-probs recorded by the generator."""
    advantages: torch.Tensor
    """[B] one advantage per sequence."""
    mask: torch.Tensor
    """[B, T] float, 1.0 on real completion tokens, 0.0 on padding."""
    ref_logprobs: torch.Tensor | None = None
    """[B, T] reference-model log-probs; needed when kl_beta > 0 (reported as `kl` when given)."""
    prox_logprobs: torch.Tensor | None = None
    """[B, T] proximal policy = the weights before this optimizer step (decoupled_ppo), no grad.
    With one optimizer step per batch this is simply logprobs.detach()."""
    entropy: torch.Tensor | None = None
    """[B, T] per-token entropy of the current policy; needed when entropy_coef > 0."""
    total_tokens: float = 0.0
    """Sum of mask over the WHOLE global batch (all micro-batches, all ranks). 0: this micro-batch."""
    total_seqs: float = 0.0
    """Sequences in the whole global batch. 0: this micro-batch."""
    dp_world_size: int = 1
    """FSDP averages gradients over this many ranks; the loss is multiplied by it to undo that."""


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
