"""Each objective's settings: the knobs it reads and its defaults, declared next to its formula.

    class TISSettings(LossSettings):          # in streamrl/losses/tis.py
        tis_cap: float = Field(2.0, gt=0)
    @register_loss("tis", settings=TISSettings)

`loss:` in the config (streamrl.config.schema.LossConfig) holds the settings every objective shares
(KL, entropy, aggregation, advantage, DAPO's reward shaping) and passes the rest through; the
objective named by `loss.name` registers a `LossSettings` subclass that declares its own
parameters (eps_low, tis_cap, ...) and its defaults for the shared ones (sapo: seq_mean).
streamrl.losses.resolve_loss validates the section against that class, so a setting that the
chosen objective does not have, or one that contradicts its definition, is a ConfigError naming
the fix. This module imports neither torch nor the objectives.
"""

from __future__ import annotations

import difflib
from typing import Any, ClassVar

from pydantic import ConfigDict, Field, ValidationError

from streamrl.config.schema import LossConfig
from streamrl.core.errors import ConfigError


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


def settings_error(name: str, cls: type[LossSettings], exc: ValidationError) -> ConfigError:
    problems = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            own = sorted(set(cls.model_fields) - set(LossConfig.model_fields))
            close = difflib.get_close_matches(key, list(cls.model_fields), n=1)
            problems.append(
                f"loss.{key} is not a setting of loss.name={name}"
                + (f"; did you mean loss.{close[0]}?" if close else "")
                + " (its own settings: "
                f"{', '.join(own) or 'none'}; shared: {', '.join(sorted(LossConfig.model_fields))}); "
                "remove it or pick the objective that has it (docs/losses.md)"
            )
        else:
            problems.append(f"loss.{key}: {err['msg']}")
    return ConfigError("; ".join(problems))
