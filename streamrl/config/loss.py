"""The loss settings every objective shares (each objective declares its own: streamrl/losses)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from streamrl.config.base import Section

Aggregation = Literal["token_mean", "seq_mean", "fixed_horizon"]
Advantage = Literal["group_norm", "group_mean", "loo"]
_LOSS_NAME = re.compile(r"[A-Za-z_]\w*|[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


class LossConfig(Section):
    """The settings every objective shares. An objective's own parameters (eps_low, eps_high,
    dual_clip_c, tis_cap, sapo_tau_pos, ...) and its defaults for these are declared by the
    objective (streamrl/losses/*.py, docs/losses.md); they pass through here and are checked
    against the objective named by `name` where the loss is resolved (streamrl.losses.resolve_loss:
    preflight and trainer start), so this schema needs no registry of objectives."""

    # extra="allow": keys of the chosen objective; resolve_loss rejects any the objective lacks.
    model_config = ConfigDict(extra="allow", validate_assignment=True)

    name: str = "grpo"
    """Objective: grpo, dr_grpo, dapo, gspo, cispo, sapo, tis, decoupled_ppo, clipped_reinforce,
    reinforce (registry: streamrl.losses; formulas and each one's settings: docs/losses.md). Or
    `package.module:function`: an objective in your own module, imported by the trainer. Checked
    against the registry by preflight (`streamrl config`, `streamrl up`) and at trainer start."""
    kl_beta: float = Field(0.0, ge=0)
    """Weight of the KL penalty to the reference model; 0 disables the reference workers."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    advantage: Advantage = "group_norm"
    """Per-group advantage (streamrl.assemble.advantages); dr_grpo fixes group_mean."""
    aggregation: Aggregation = "token_mean"
    """How per-token losses become one number (docs/losses.md, "Aggregation"); the objective may set
    another default (sapo: seq_mean) or fix it (gspo: seq_mean, dr_grpo: fixed_horizon, dapo: token_mean)."""
    log_ratio_clamp: float = Field(20.0, gt=0)
    entropy_coef: float = Field(0.0, ge=0)
    """Entropy bonus: loss -= entropy_coef * aggregated entropy. 0 disables it."""
    horizon: int | None = Field(None, ge=1)
    """Constant per-sequence token budget of aggregation=fixed_horizon (Dr. GRPO). None:
    generator.max_tokens."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: the assembler drops groups whose rewards are all equal (a zero-variance group
    has zero advantage everywhere) and waits for more (streamrl/assemble/assembler.py). On by default for dapo."""
    overlong_filter: bool = False
    """DAPO overlong filtering: completions cut at generator.max_tokens (finish_reason "length")
    contribute no loss (their tokens are masked), so truncation noise is not learned."""
    overlong_buffer: int = Field(0, ge=0)
    """DAPO soft overlong punishment: length of the interval before generator.max_tokens over
    which the reward ramps down (streamrl.assemble.advantages.overlong_penalty). 0 disables it."""
    overlong_penalty: float = Field(1.0, ge=0)
    """Reward subtracted at (and past) generator.max_tokens when overlong_buffer > 0."""
    icepop_low: float | None = Field(None, gt=0)
    """IcePop (Ring-1T, 2025): tokens whose ratio k = pi_old / pi_behaviour is below this contribute
    no loss (with icepop_high); the rest are weighted by k, the objective run against pi_old
    (docs/losses.md, "Mismatch corrections"). None: off; e.g. 0.5."""
    icepop_high: float | None = Field(None, gt=0)
    """IcePop upper bound: tokens with k above it contribute no loss. None: off; e.g. 2 (or 5)."""
    seq_mis_low: float | None = Field(None, gt=0)
    """Sequence-level masked IS: a sequence whose geometric-mean ratio exp(mean_t log k) is below
    this contributes no loss (with seq_mis_high). None: off; e.g. 0.999."""
    seq_mis_high: float | None = Field(None, gt=0)
    """Sequence-level masked IS upper bound on the geometric-mean ratio. None: off; e.g. 1.001."""
    tis_token_cap: float | None = Field(None, gt=0)
    """Token-level TIS on any objective: the objective runs against pi_old and each token is weighted
    by sg(min(k, C)), so its importance weight is at most C. Not with tis/decoupled_ppo (their own
    cap) or tis_seq_cap. None: off."""
    tis_seq_cap: float | None = Field(None, gt=0)
    """Sequence-level TIS: as tis_token_cap with the weight sg(min(prod_t k, C)) per sequence. None: off."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        # Syntax only: whether the objective exists is resolve_loss's question.
        if _LOSS_NAME.fullmatch(value):
            return value
        raise ValueError(
            f"loss.name={value!r} is neither an objective name nor `package.module:function`; "
            "e.g. loss.name=grpo or loss.name=my_losses:my_loss"
        )
