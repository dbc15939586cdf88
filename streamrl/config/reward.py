"""What a rollout needs before training: the reward function(s), the reference model's
log-probs, external producers' annotations and how they combine."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from streamrl.config.base import Section
from streamrl.core.imports import CODE_SPEC, as_spec

REWARD_BUILTINS = ("charclass", "math", "math_lenient", "math_regex", "think_format", "env", "reasoning_gym")
"""Built-in reward names (streamrl.annotate.rewards.BUILTIN_REWARDS)."""


def _check_reward_fn(value: str, where: str) -> str:
    # Syntax only: user modules are imported by the reward worker, never at config time.
    if value in REWARD_BUILTINS or CODE_SPEC.fullmatch(value):
        return value
    raise ValueError(
        f"{where}={value!r} is neither a built-in reward ({', '.join(REWARD_BUILTINS)}) nor "
        "`package.module:function` (or `path/to/script.py:function`); e.g. set reward.fn=math or "
        "reward.fn=my_rewards:score"
    )


class RewardComponent(Section):
    """One term of a combined reward (reward.components)."""

    fn: str
    """A built-in reward name or `package.module:function`, as reward.fn (in Python: the function itself)."""
    weight: float = 1.0
    """Its weight in the sum that becomes the `reward` annotation."""
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]+$")
    """Its name in metrics.jsonl's reward_components (`reward/<name>`); default: its `fn` as written,
    `:` read as `.` (reward/math, reward/my_rewards.score), not the bare function name, which says
    neither where it comes from nor tells two modules' `score` apart."""

    @field_validator("fn", mode="before")
    @classmethod
    def _callable(cls, value: object) -> object:
        return as_spec(value, "reward.components[].fn")

    @field_validator("fn")
    @classmethod
    def _fn(cls, value: str) -> str:
        return _check_reward_fn(value, "reward.components[].fn")

    def label(self) -> str:
        return self.name or self.fn.replace(":", ".")


class RewardConfig(Section):
    count: int = Field(1, ge=0)
    fn: str = "charclass"
    """A built-in reward (charclass; math = math-verify's answer check; math_regex = the last number;
    think_format = <think>...</think> structure) or `package.module:function`, or
    `path/to/script.py:function` (a file imported by its path: what the Python API records for a
    function defined in the calling script, streamrl.Config(reward={"fn": score}))."""
    timeout_s: float = Field(10.0, gt=0)
    on_error: Literal["drop", "score"] = "drop"
    """A rollout whose reward function raised, timed out or returned NaN/inf: `drop` fails its whole
    group (the feeder admits a replacement); `score` trains it with reward.error_value. `drop` is the
    default because a made-up score is a training signal: when failures correlate with the output
    (long completions time out, odd ones crash a parser) it teaches the policy to avoid or seek them.
    Use `score` when a failure means the completion is bad (error_value = the worst reward)."""
    error_value: float = 0.0
    """The reward of a rollout whose reward function failed, under reward.on_error=score."""

    components: list[RewardComponent] = []
    """Several rewards combined, e.g. [{fn: math, weight: 1.0}, {fn: think_format, weight: 0.2}]: the
    `reward` annotation is sum(weight * fn(...)) and each term is logged as reward_components
    ["reward/<name>"] in metrics.jsonl. When set, reward.fn is not used."""

    @field_validator("fn", mode="before")
    @classmethod
    def _callable(cls, value: object) -> object:
        return as_spec(value, "reward.fn")

    @field_validator("fn")
    @classmethod
    def _fn(cls, value: str) -> str:
        return _check_reward_fn(value, "reward.fn")

    @field_validator("components")
    @classmethod
    def _components(cls, value: list[RewardComponent]) -> list[RewardComponent]:
        labels = [c.label() for c in value]
        if len(set(labels)) != len(labels):
            raise ValueError(f"reward.components: names {labels} repeat; give each a distinct `name`")
        return value


class ReferenceConfig(Section):
    count: int = Field(1, ge=0)
    """Reference workers; started only when loss.kl_beta > 0 and reference.source is `worker`
    (0 in the resolved config when it is `trainer`)."""
    source: Literal["auto", "worker", "trainer"] = "auto"
    """Who computes the KL term's reference log-probs. `worker`: reference.count reference workers,
    each loading model.path, annotate every rollout (`ref_logprobs`). `trainer`: the trainer computes
    them in its own step from its own model with the LoRA adapter disabled (the frozen base is the
    reference), so no reference worker and no second copy of the model exist; needs trainer.lora.
    `auto`: `trainer` with trainer.lora, else `worker` (RUN_DIR/config.yaml holds the resolved value)."""
    batch_size: int = Field(32, ge=1)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the frozen reference model runs: `auto` follows trainer.device; `cpu` keeps it off the
    GPUs when they are short (slower log-probs, no GPU memory); `cuda` puts it on a GPU."""


class ExternalAnnotation(Section):
    key: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    """Annotation key an external producer writes (`streamrl reward --key`, examples/node); its
    name in Batch.reward_components and in metrics.jsonl's `reward_components`."""
    weight: float = 1.0
    """Weight of this key's value in the combined reward (see annotations.reward_weight)."""
    timeout_s: float = Field(30.0, gt=0)
    """Seconds the assembler waits for this key once all of a group's rollouts have arrived."""
    on_timeout: Literal["default", "drop"] = "default"
    """`default`: use `default` for the missing values; `drop`: drop the whole group (counted as
    `dropped_timeout`; the feeder admits a replacement). Also applies to an `error` annotation."""
    default: float = 0.0
    """Value used for a timed-out (or errored) annotation under on_timeout=default."""


class AnnotationsConfig(Section):
    reward_weight: float = 1.0
    """Weight of the built-in `reward` annotation. The trained reward is
    reward_weight * reward + sum(weight * value) over annotations.external."""
    external: list[ExternalAnnotation] = []
    """Keys written by external producers; every rollout needs each one (or its timeout policy)."""

    @field_validator("external")
    @classmethod
    def _unique(cls, value: list[ExternalAnnotation]) -> list[ExternalAnnotation]:
        keys = [e.key for e in value]
        for key in keys:
            if key in ("reward", "ref_logprobs") or keys.count(key) > 1:
                raise ValueError(
                    f"annotations.external: key {key!r} is built-in or listed twice; give each "
                    "external producer its own key, e.g. key: judge"
                )
        return value
