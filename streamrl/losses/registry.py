"""The objective registry: names -> per-token loss functions with their settings, built-ins found
by name without importing the others, user objectives (`package.module:function`) imported on
demand, and the resolution of a config's `loss:` section against its objective.

    settings = resolve_loss(cfg)          # ConfigError naming the fix for a bad name or setting
    get_objective(settings.name).fn(settings, inputs) -> streamrl.losses.core.Terms

Importing this module does not import torch; an objective's module does, when it is first used.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from pydantic import ValidationError

from streamrl.config.schema import LossConfig
from streamrl.core.errors import ConfigError
from streamrl.core.imports import import_spec
from streamrl.losses.settings import ClipSettings, LossSettings, settings_error

if TYPE_CHECKING:
    from streamrl.config.schema import Config

PACKAGE = "streamrl.losses"

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
    weights_behaviour: bool = False
    """The objective itself weights each token by a truncated importance weight pi_old / pi_b
    (tis, decoupled_ppo): the shared TIS caps would weight it twice, so they are refused, and the
    mismatch corrections only mask it (streamrl/losses/corrections.py)."""


_REGISTRY: dict[str, Objective] = {}
_USER_LOSSES: dict[str, Objective] = {}
"""`module:function` objectives loaded so far (kept apart: they are not names to list or register)."""


def register_loss(
    name: str,
    *,
    requires: Iterable[str] = (),
    settings: type[LossSettings] = ClipSettings,
    weights_behaviour: bool = False,
) -> Callable:
    """Decorator: make `fn(cfg, inp) -> Terms` available as `loss.name=<name>`; `cfg` is an instance
    of `settings` (the objective's parameters and defaults, a LossSettings subclass).
    `weights_behaviour`: see Objective."""
    req = frozenset(requires)
    if not req <= set(INPUT_NAMES):
        raise ValueError(f"register_loss({name!r}): requires={sorted(req)} must be a subset of {INPUT_NAMES}")
    if not (isinstance(settings, type) and issubclass(settings, LossSettings)):
        raise ValueError(
            f"register_loss({name!r}): settings={settings!r} must be a streamrl.losses.LossSettings subclass"
        )

    def deco(fn: Callable) -> Callable:
        old = _REGISTRY.get(name)
        if old is not None and (old.fn.__module__, old.fn.__qualname__) != (fn.__module__, fn.__qualname__):
            raise ValueError(
                f"loss {name!r} is already registered by {old.fn.__module__}.{old.fn.__qualname__}; "
                "pick another name for the new objective"
            )
        _REGISTRY[name] = Objective(name, fn, req, settings, weights_behaviour)
        return fn

    return deco


def _import_all() -> None:
    for mod in pkgutil.iter_modules([str(Path(__file__).parent)]):
        importlib.import_module(f"{PACKAGE}.{mod.name}")


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
    module_name, attr, fn = import_spec(
        name, f"loss.name={name!r}", "install it or put its directory on PYTHONPATH (every trainer rank imports it)"
    )
    if not callable(fn):
        raise ConfigError(
            f"loss.name={name!r}: module {module_name!r} has no function {attr!r}; define "
            "`def NAME(cfg, inp: streamrl.losses.LossInputs) -> streamrl.losses.core.Terms` there "
            "(docs/losses.md, 'An objective in your own module')"
        )
    requires = frozenset(getattr(fn, "requires", ()))
    if not requires <= set(INPUT_NAMES):
        raise ConfigError(f"loss.name={name!r}: {attr}.requires={sorted(requires)} must be a subset of {INPUT_NAMES}")
    settings = getattr(fn, "settings", ClipSettings)
    if not (isinstance(settings, type) and issubclass(settings, LossSettings)):
        raise ConfigError(
            f"loss.name={name!r}: {attr}.settings={settings!r} is not a subclass of "
            "streamrl.losses.LossSettings; declare `class MySettings(LossSettings)` with your fields"
        )
    _USER_LOSSES[name] = Objective(name, fn, requires, settings)
    return _USER_LOSSES[name]


def get_objective(name: str) -> Objective:
    if ":" in name:
        return _USER_LOSSES.get(name) or load_user_loss(name)
    if name not in _REGISTRY and name in BUILTIN_LOSSES:
        importlib.import_module(f"{PACKAGE}.{BUILTIN_LOSSES[name]}")
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


def loss_settings(loss: LossConfig, max_tokens: int | None = None) -> LossSettings:
    """`loss` validated against its objective's settings class, defaults filled in. With
    aggregation=fixed_horizon and no loss.horizon, the horizon is max_tokens (when given)."""
    if isinstance(loss, LossSettings):
        return loss
    obj = get_objective(loss.name)  # ConfigError listing the objectives for an unknown name
    cls = obj.settings
    data = loss.model_dump(exclude_unset=True)
    data["name"] = loss.name
    for key, want in cls.fixed.items():
        if key in data and data[key] != want:
            raise ConfigError(
                f"loss.name={loss.name} means loss.{key}={want}{cls.why}; remove "
                f"loss.{key}={data[key]} or use loss.name=grpo with your settings"
            )
    try:
        settings = cls.model_validate({**data, **cls.fixed})
    except ValidationError as exc:
        raise settings_error(loss.name, cls, exc) from None
    _check_corrections(loss.name, obj, settings)
    if settings.aggregation == "fixed_horizon" and settings.horizon is None and max_tokens is not None:
        settings = settings.model_copy(update={"horizon": max_tokens})
    return settings


def _check_corrections(name: str, obj: Objective, cfg: LossSettings) -> None:
    """Importance weights that would count the sampler's ratio twice are config errors."""
    if cfg.tis_token_cap is not None and cfg.tis_seq_cap is not None:
        raise ConfigError(
            "loss.tis_token_cap and loss.tis_seq_cap are two importance weights for the same sampler "
            "mismatch (together they weight a token twice); keep one of them (docs/losses.md, "
            "'Mismatch corrections')"
        )
    caps = [k for k in ("tis_token_cap", "tis_seq_cap") if getattr(cfg, k) is not None]
    if caps and obj.weights_behaviour:
        own = {"tis": "loss.tis_cap", "decoupled_ppo": "loss.behav_weight_cap"}.get(name, "its own cap")
        raise ConfigError(
            f"loss.name={name} already weights each token by a truncated importance weight "
            f"pi_old / pi_b; loss.{caps[0]} would weight it twice. Set {own} instead, or use "
            f"loss.{caps[0]} with another objective (e.g. loss.name=reinforce or grpo)"
        )


def resolve_loss(cfg: Config) -> LossSettings:
    """The job's loss settings: cfg.loss against its objective, the fixed horizon from
    generator.max_tokens. Raises ConfigError (preflight reports it before anything starts)."""
    return loss_settings(cfg.loss, max_tokens=cfg.generator.max_tokens)
