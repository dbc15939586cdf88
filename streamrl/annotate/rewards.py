"""Reward functions: (prompt_text, completion_text, meta) -> float, resolved from `reward.fn`.

    fn = resolve_reward(cfg.reward.fn)      # a built-in (BUILTIN_REWARDS) or "package.module:function"
    r = fn(prompt, completion, item["meta"])
    fn = make_reward(cfg.reward)            # reward.components: a weighted sum that keeps its parts

Built-ins are pure functions of their arguments (no I/O), so a reward worker can call them
for every rollout and tests can call them directly.
"""

from __future__ import annotations

import inspect
import math
import re
from typing import Callable

from streamrl.core.errors import ConfigError
from streamrl.core.imports import import_spec
from streamrl.tasks.charclass import charclass_reward
from streamrl.tasks.math_answers import math_lenient_reward, math_verify_reward, think_format_reward
from streamrl.tasks.reasoning_gym import reasoning_gym_reward

RewardFn = Callable[[str, str, dict], float]

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_HASHES = re.compile(r"####\s*\$?\s*(-?[\d,]*\.?\d+)")


def _to_float(text: str) -> float | None:
    try:
        return float(text.replace(",", "").strip().rstrip("."))
    except ValueError:
        return None


def extract_final_number(completion: str) -> float | None:
    """The answer a completion commits to: last '#### N', else last \\boxed{N}, else the last number."""
    for pattern in (_HASHES, _BOXED):
        found = pattern.findall(completion)
        if found:
            value = _to_float(found[-1].replace("$", ""))
            if value is not None:
                return value
    numbers = _NUMBER.findall(completion)
    return _to_float(numbers[-1]) if numbers else None


def math_reward(prompt: str, completion: str, meta: dict) -> float:
    """`math_regex`: 1.0 if the completion's final number equals meta["answer"] (to 1e-6 relative),
    else 0.0. Numbers only; `math` (math-verify) also compares LaTeX and symbolic answers."""
    got = extract_final_number(completion)
    want = _to_float(str(meta["answer"]))
    if got is None or want is None:
        return 0.0
    return 1.0 if math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-6) else 0.0


def env_reward(prompt: str, completion: str, meta: dict) -> float:
    """A multi-turn episode's environment reward (the sum of its steps' rewards), which the
    generator records in the rollout's meta["env_reward"] (streamrl/envs/base.py)."""
    if "env_reward" not in meta:
        raise ValueError(
            "rollout has no meta['env_reward']: reward.fn=env scores multi-turn episodes only "
            "(set env.fn, or choose another reward.fn)"
        )
    return float(meta["env_reward"])


BUILTIN_REWARDS: dict[str, RewardFn] = {
    "charclass": charclass_reward,
    "math": math_verify_reward,
    "math_lenient": math_lenient_reward,
    "math_regex": math_reward,
    "think_format": think_format_reward,
    "env": env_reward,
    "reasoning_gym": reasoning_gym_reward,
}
"""Names usable as reward.fn (streamrl.config.schema.REWARD_BUILTINS lists the same names)."""


def resolve_reward(spec: str) -> RewardFn:
    """A built-in reward by name, or the function named by `package.module:function`."""
    if spec in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[spec]
    if ":" not in spec:
        raise ConfigError(
            f"reward.fn={spec!r} is not a built-in reward ({', '.join(sorted(BUILTIN_REWARDS))}); "
            "use one of those or `package.module:function`"
        )
    module_name, attr, fn = import_spec(spec, f"reward.fn={spec!r}", "install it or put its directory on PYTHONPATH")
    if not callable(fn):
        raise ConfigError(
            f"reward.fn={spec!r}: module {module_name!r} has no function {attr!r}; "
            "define `def NAME(prompt: str, completion: str, meta: dict) -> float` there"
        )
    if inspect.iscoroutinefunction(fn):
        # The reward worker calls it on a thread and float()s the result: a coroutine would fail every rollout.
        raise ConfigError(
            f"reward.fn={spec!r} is an `async def`; reward.fn must be a plain `def` returning a float "
            "(for an async judge, run it as an external producer: `streamrl reward --fn ...`)"
        )
    return fn


class Scored(float):
    """A combined reward: its value is the weighted sum; `parts` holds each component's own score."""

    parts: dict[str, float]

    def __new__(cls, value: float, parts: dict[str, float]) -> "Scored":
        out = super().__new__(cls, value)
        out.parts = parts
        return out


def make_reward(cfg) -> RewardFn:
    """The reward a reward worker computes for `cfg` (a RewardConfig): reward.fn, or with
    reward.components the weighted sum of theirs, returned as a `Scored` carrying each part."""
    if not cfg.components:
        return resolve_reward(cfg.fn)
    parts = [(c.label(), c.weight, resolve_reward(c.fn)) for c in cfg.components]

    def combined(prompt: str, completion: str, meta: dict) -> float:
        scores = {name: float(fn(prompt, completion, meta)) for name, _, fn in parts}
        return Scored(sum(w * scores[name] for name, w, _ in parts), scores)

    return combined
