"""The assembler's join policy for required annotations: which keys a group still waits for, what
happens when an external key times out or reports an error, and how the reward components combine.

    policy = JoinPolicy(cfg)                                   # cfg.annotations (streamrl/config/schema.py)
    policy.verdict({"judge"}, waited_s=31.0)                   # -> "default" | "drop" | "wait" | "ready"
    total, parts = policy.combine({"reward": r, "judge": j})   # weighted sum + each part, for metrics

Built-in keys (`reward`, `ref_logprobs`, the judge's judge.key) never time out: their workers are part of the job and
their pending work is taken over if one dies. External keys (annotations.external) each carry a
weight, a timeout counted from the moment all of a group's rollouts are in, and an on_timeout
policy: `default` substitutes the configured value, `drop` drops the group. An `error`
annotation on an external key applies the same policy at once (the producer gave up on it); on a
built-in key it fails the group, except `reward` under reward.on_error=score (reward.error_value)
and the judge's key under judge.on_error=score (judge.error_value).
Pure functions of their inputs, so unit tests need no broker.

Shapes (`shape`): `reward`, the judge's key and every external key are scalars (they are weighted into the reward);
`ref_logprobs` is a vector of one float32 per completion token. A value of the wrong shape makes
the annotation invalid (`invalid`, `mismatch`): the assembler dead-letters it with the key and the
producer, so it never reaches the train step. A key the job does not use is never read: it is
accepted whatever its value and acked with its group.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from streamrl.config.schema import Config, ExternalAnnotation
from streamrl.core.messages import Annotation

Verdict = Literal["ready", "wait", "default", "drop"]
Shape = Literal["scalar", "tokens"]
TIMEOUT_PRODUCER = "assembler:timeout"
"""`producer` of the stand-in annotation the assembler files when a key times out under `default`."""


class JoinPolicy:
    def __init__(self, cfg: Config):
        self.required = cfg.required_annotations()
        self.reward_error_value = cfg.reward.error_value if cfg.reward.on_error == "score" else None
        """reward.on_error=score: the value of an errored `reward` annotation (None: it fails the group)."""
        self.external: dict[str, ExternalAnnotation] = {e.key: e for e in cfg.annotations.external}
        self.reward_weight = cfg.annotations.reward_weight
        self.judge = cfg.judge
        """The judge section (judge workers write judge.key, weighted by judge.weight), or None."""
        self.weights = cfg.reward_weights()
        self.reward_keys = list(self.weights)
        """Scalar keys that make up the trained reward, in the order they are logged."""
        self.part_keys = [f"reward/{c.label()}" for c in cfg.reward.components]
        """reward.components: logged (from the `reward` annotation's parts), already inside `reward`."""

    def shape(self, key: str) -> Shape | None:
        """What a value of `key` must be; None: a key this job does not use."""
        if key in self.weights:
            return "scalar"
        return "tokens" if key == "ref_logprobs" else None

    def invalid(self, a: Annotation) -> str:
        """Why `a` cannot be used whatever its rollout ('' if it can): a value of the wrong shape."""
        shape = self.shape(a.key)
        if shape is None or a.error:
            return ""  # an unused key is never read; an error annotation applies its key's policy
        who = f"annotation {a.key!r} from producer {a.producer!r} for rollout {a.rollout_id!r}"
        if shape == "scalar" and isinstance(a.value, np.ndarray):
            return (
                f"{who}: {a.key!r} is a scalar key, but the value is {len(a.value)} packed float32 values; "
                "send one msgpack number"
            )
        if shape == "tokens" and not isinstance(a.value, np.ndarray):
            return f"{who}: {a.key!r} must be packed float32 bytes, one value per completion token, not a number"
        return ""

    def mismatch(self, a: Annotation, completion_tokens: int) -> str:
        """Why `a` does not fit its rollout ('' if it does): a per-token value of another length."""
        if a.error or self.shape(a.key) != "tokens" or len(a.value) == completion_tokens:
            return ""
        return (
            f"annotation {a.key!r} from producer {a.producer!r} for rollout {a.rollout_id!r}: "
            f"{len(a.value)} values for a completion of {completion_tokens} tokens"
        )

    def missing(self, rollout_ids: list[str], have: dict[str, dict]) -> set[str]:
        """Required keys that at least one of these rollouts does not have yet."""
        return {k for rid in rollout_ids for k in self.required if k not in have.get(rid, {})}

    def verdict(self, missing: set[str], waited_s: float) -> Verdict:
        """What to do with a group whose rollouts are all in, `waited_s` after that, missing `missing`.

        Wait while any built-in key or any external key still inside its timeout is missing; then
        `drop` if any timed-out key says so, else `default` (fill the timed-out keys' defaults)."""
        if not missing:
            return "ready"
        if any(k not in self.external or waited_s < self.external[k].timeout_s for k in missing):
            return "wait"
        return "drop" if any(self.external[k].on_timeout == "drop" for k in missing) else "default"

    def on_error(self, key: str) -> Literal["fail", "default", "drop"]:
        """An annotation with `error` set: a built-in key fails the group (`reward` under reward.on_error=score
        takes reward.error_value); an external one applies its policy."""
        if key == "reward" and self.reward_error_value is not None:
            return "default"
        if self.judge is not None and key == self.judge.key:
            return "default" if self.judge.on_error == "score" else "fail"
        spec = self.external.get(key)
        return "fail" if spec is None else spec.on_timeout

    def stand_in(self, rollout_id: str, key: str) -> Annotation:
        """The annotation filed for a key that timed out under on_timeout=default."""
        spec = self.external[key]
        return Annotation(
            rollout_id=rollout_id,
            key=key,
            value=spec.default,
            producer=TIMEOUT_PRODUCER,
            error=f"timed out after {spec.timeout_s}s; default {spec.default} used",
        )

    def value(self, a: Annotation) -> float:
        """A scalar annotation's value: the key's default when the producer reported an error."""
        if a.error and a.key in self.external:
            return float(self.external[a.key].default)
        if a.error and a.key == "reward" and self.reward_error_value is not None:
            return float(self.reward_error_value)
        if a.error and self.judge is not None and a.key == self.judge.key and self.judge.on_error == "score":
            return float(self.judge.error_value)
        return float(a.value)

    def components(self, annotations: list[dict[str, Annotation]]) -> dict[str, np.ndarray]:
        """Per reward key (and reward.components part), the values of these rollouts (one annotations
        dict per rollout, in order). A part missing from an errored `reward` counts as its value."""
        out = {k: np.asarray([self.value(a[k]) for a in annotations], np.float32) for k in self.reward_keys}
        for key in self.part_keys:
            name = key.split("/", 1)[1]
            out[key] = np.asarray(
                [a["reward"].parts.get(name, self.value(a["reward"])) for a in annotations], np.float32
            )
        return out

    def combine(self, parts: dict[str, np.ndarray]) -> np.ndarray:
        """reward_weight * reward + judge.weight * judge + sum(weight * value) over the external keys (float32)."""
        total = np.zeros_like(parts["reward"], dtype=np.float64)
        for key, weight in self.weights.items():
            total = total + weight * parts[key].astype(np.float64)
        return total.astype(np.float32)
