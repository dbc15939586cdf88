"""Each objective's settings: the knobs it reads and its defaults, declared next to its formula.

    settings = resolve_loss(cfg)             # at trainer start and in preflight, before anything runs
    loss, metrics = compute_loss(settings, inp)

`loss:` in the config (streamrl.config.LossConfig) holds the settings every objective shares
(KL, entropy, aggregation, advantage, DAPO's reward shaping) and passes the rest through; the
objective named by `loss.name` registers a `LossSettings` subclass that declares its own
parameters (eps_low, tis_cap, ...) and its defaults for the shared ones (sapo: seq_mean).
`resolve_loss` validates the section against that class, so a setting that the chosen objective
does not have, or one that contradicts its definition, is a ConfigError naming the fix.
This module does not import torch; it imports the objective's module (which does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import ConfigDict, Field, ValidationError

from streamrl.config import LossConfig
from streamrl.errors import ConfigError

if TYPE_CHECKING:
    from streamrl.config import Config


class LossSettings(LossConfig):
    """The shared settings, with nothing else allowed: the base of every objective's settings."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    fixed: ClassVar[dict[str, Any]] = {}
    """Shared settings that define the method (dr_grpo: aggregation=fixed_horizon); setting another
    value is a ConfigError rather than a silently different method."""
    why: ClassVar[str] = ""
    """Why the fixed settings are fixed, quoted in that error."""


class ClipSettings(LossSettings):
    """A trust region [1 - eps_low, 1 + eps_high] around the ratio (PPO-clip, CISPO, GSPO, ...)."""

    eps_low: float = Field(0.2, ge=0)
    """Lower clip range: the ratio is clipped at 1 - eps_low."""
    eps_high: float = Field(0.2, ge=0)
    """Upper clip range: 1 + eps_high. DAPO's clip-higher sets 0.28."""


class PPOSettings(ClipSettings):
    dual_clip_c: float | None = Field(None, gt=1)
    """Dual clip (Ye et al. 2020) for A < 0: the per-token loss is capped at -c*A. None disables it;
    3 is the usual value."""


def _settings_error(name: str, cls: type[LossSettings], exc: ValidationError) -> ConfigError:
    problems = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            own = sorted(set(cls.model_fields) - set(LossConfig.model_fields))
            problems.append(f"loss.{key} is not a setting of loss.name={name} (its own settings: "
                            f"{', '.join(own) or 'none'}; shared: {', '.join(sorted(LossConfig.model_fields))}); "
                            "remove it or pick the objective that has it (docs/losses.md)")
        else:
            problems.append(f"loss.{key}: {err['msg']}")
    return ConfigError("; ".join(problems))


def loss_settings(loss: LossConfig, max_tokens: int | None = None) -> LossSettings:
    """`loss` validated against its objective's settings class, defaults filled in. With
    aggregation=fixed_horizon and no loss.horizon, the horizon is max_tokens (when given)."""
    if isinstance(loss, LossSettings):
        return loss
    from streamrl.losses import get_objective

    obj = get_objective(loss.name)  # ConfigError listing the objectives for an unknown name
    cls = obj.settings
    data = loss.model_dump(exclude_unset=True)
    data["name"] = loss.name
    for key, want in cls.fixed.items():
        if key in data and data[key] != want:
            raise ConfigError(f"loss.name={loss.name} means loss.{key}={want}{cls.why}; remove "
                              f"loss.{key}={data[key]} or use loss.name=grpo with your settings")
    try:
        settings = cls.model_validate({**data, **cls.fixed})
    except ValidationError as exc:
        raise _settings_error(loss.name, cls, exc) from None
    if settings.aggregation == "fixed_horizon" and settings.horizon is None and max_tokens is not None:
        settings = settings.model_copy(update={"horizon": max_tokens})
    return settings


def resolve_loss(cfg: Config) -> LossSettings:
    """The job's loss settings: cfg.loss against its objective, the fixed horizon from
    generator.max_tokens. Raises ConfigError (preflight reports it before anything starts)."""
    return loss_settings(cfg.loss, max_tokens=cfg.generator.max_tokens)
