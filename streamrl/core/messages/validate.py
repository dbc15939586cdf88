"""The checks a decoded message passes: plain field types on the decoded map (`check_types`), then the
rules across fields (`validate`); each failure is a DecodeError that says what is wrong.
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

import numpy as np

from streamrl.core.errors import DecodeError
from streamrl.core.messages.types import (
    MESSAGE_TYPES,
    Annotation,
    EpisodeState,
    Observation,
    Prompt,
    Rollout,
    StepRequest,
)

_F32_MAX = float(np.finfo(np.float32).max)


def _check(cond: bool, why: str) -> None:
    if not cond:
        raise DecodeError(why)


_FIELD_TYPES = {
    "str": ((str,), "a string"),
    "int": ((int,), "an int"),
    "float": ((int, float), "a number"),
    "dict": ((dict,), "a map"),
    "list": ((list,), "a list"),
}
_CHECKS: dict[type, dict[str, tuple[frozenset, str]]] = {
    cls: {
        f.name: (frozenset(_FIELD_TYPES[f.type][0]), f"{cls.kind}.{f.name} must be {_FIELD_TYPES[f.type][1]}")
        for f in fields(cls)
        if f.type in _FIELD_TYPES
    }
    for cls in MESSAGE_TYPES.values()
}
"""Per message class: field -> (accepted types, error) for the plainly typed fields, built once."""


def check_types(cls: type, data: dict) -> None:
    """The plainly typed fields present in `data` have their type. Exact types: msgpack decodes to
    exactly str, int, float, dict, list (bool is not accepted for an int, as before)."""
    checks = _CHECKS[cls]
    for name in checks.keys() & data.keys():
        types, why = checks[name]
        if type(data[name]) not in types:
            raise DecodeError(why)


def _all_finite(values: np.ndarray) -> bool:
    """No NaN or inf. A float64 sum of float32 values cannot overflow, so it is finite exactly when
    every value is: one pass, faster than np.isfinite(values).all() on the hot path."""
    return math.isfinite(np.add.reduce(values, dtype=np.float64))  # .sum() without its Python wrapper


def validate(msg: Any) -> None:
    """The checks across fields (the plain types are check_types', on the decoded map)."""
    if isinstance(msg, EpisodeState):
        _check(
            msg.turn == len(msg.actions) - 1 and all(isinstance(a, str) for a in msg.actions),
            "episode_state: turn must equal len(actions) - 1, actions strings",
        )
    if isinstance(msg, (Rollout, EpisodeState)):
        what = msg.kind
        _check(len(msg.completion_ids) == len(msg.logprobs), f"{what}: completion_ids and logprobs differ in length")
        _check(_all_finite(msg.logprobs), f"{what}: logprobs contain NaN or inf")
        for sw in msg.version_switches:
            _check(
                isinstance(sw, list) and len(sw) == 2 and all(type(x) is int for x in sw),
                f"{what}: version_switches must be [[index, version], ...] of ints",
            )
            _check(0 <= sw[0] <= len(msg.completion_ids), f"{what}: a version switch index is outside the completion")
        last = 0
        for span in msg.obs_spans:
            _check(
                isinstance(span, list)
                and len(span) == 2
                and all(type(x) is int for x in span)
                and last <= span[0] <= span[1] <= len(msg.completion_ids),
                f"{what}: obs_spans must be sorted, non-overlapping [[start, end], ...] inside the completion",
            )
            last = span[1]
    if isinstance(msg, Rollout):
        _check(0 <= msg.sample < msg.group_size, "rollout: sample must be in [0, group_size)")
    if isinstance(msg, Prompt):
        _check(msg.group_size >= 1, "prompt: group_size must be >= 1")
        t = msg.temperature
        _check(
            t is None or (isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t >= 0),
            "prompt: temperature must be null or a number >= 0",
        )
    if isinstance(msg, StepRequest):
        _check(all(isinstance(a, str) for a in msg.actions), "step_request: actions must be strings")
        _check(msg.turn == len(msg.actions) - 1, "step_request: turn must equal len(actions) - 1")
    if isinstance(msg, Observation):
        _check(type(msg.done) is bool, "observation.done must be a bool")
        _check(msg.turn >= 0, "observation.turn must be >= 0")
        _check(math.isfinite(msg.reward), "observation.reward is NaN or inf")
        _check(msg.error_kind in ("", "replay"), "observation.error_kind must be '' or 'replay'")
        _check(
            all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in msg.messages
            ),
            "observation.messages must be [{role: str, content: str}, ...]",
        )
    if isinstance(msg, (Observation, EpisodeState)):
        _check(
            all(
                isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                for k, v in msg.counts.items()
            ),
            f"{msg.kind}.counts must map str to finite numbers",
        )
    if isinstance(msg, Annotation):
        v = msg.value
        if isinstance(v, np.ndarray):
            if not _all_finite(v):
                raise DecodeError("values contain NaN or inf")
        elif not isinstance(v, (int, float)) or isinstance(v, bool):
            raise DecodeError(f"value must be a number or float32 bytes, got {type(v).__name__}")
        elif not math.isfinite(v):
            raise DecodeError("value is NaN or inf")
        elif abs(v) > _F32_MAX:  # rewards are trained as float32: it would become inf in the advantages
            raise DecodeError(f"value {v!r} is beyond the float32 range (|v| <= {_F32_MAX:.4g})")
        for name, part in msg.parts.items():
            _check(
                isinstance(name, str)
                and isinstance(part, (int, float))
                and not isinstance(part, bool)
                and math.isfinite(part),
                f"annotation {msg.key}: parts must map names to finite numbers",
            )
