"""Every wire type, its schema version, and its msgpack encoding. Nothing else touches raw fields.

A stream entry has one field, `d`, holding a msgpack map with `schema` (int) and `kind` (str).
Token ids travel as packed little-endian int32, log-probs as packed little-endian float32
(`bytes` in msgpack), so a producer in any language can read them. Never pickle.

    blob = encode(Rollout(...)); msg = decode(blob)   # raises DecodeError on anything malformed
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

import msgpack
import numpy as np

from streamrl.errors import DecodeError

SCHEMA_VERSION = 1
FIELD = "d"
"""The single field name of every stream entry."""
MAX_ENTRY_BYTES = 16 * 1024 * 1024

_I32 = np.dtype("<i4")
_F32 = np.dtype("<f4")


def pack_i32(values: Any) -> bytes:
    return np.asarray(values, dtype=_I32).tobytes()


def pack_f32(values: Any) -> bytes:
    return np.asarray(values, dtype=_F32).tobytes()


def unpack_i32(blob: bytes) -> np.ndarray:
    if not isinstance(blob, (bytes, bytearray)) or len(blob) % 4:
        raise DecodeError("int32 array must be bytes with a length divisible by 4")
    return np.frombuffer(blob, dtype=_I32)


def unpack_f32(blob: bytes) -> np.ndarray:
    if not isinstance(blob, (bytes, bytearray)) or len(blob) % 4:
        raise DecodeError("float32 array must be bytes with a length divisible by 4")
    return np.frombuffer(blob, dtype=_F32)


@dataclass
class Prompt:
    """One prompt group admitted by the feeder (stream `prompts`)."""

    kind: ClassVar[str] = "prompt"
    group_id: str
    prompt_ids: np.ndarray
    group_size: int
    admitted_version: int
    """Trainer version at admission; a generator loads at least this version before generating."""
    text: str = ""
    meta: dict = field(default_factory=dict)
    """Task data the reward needs (e.g. the reference answer)."""
    index: int = 0
    """Feeder sequence number (0, 1, 2, ...)."""
    temperature: float | None = None
    """Sampling temperature for this group; None: the generator's (generator.temperature). Eval rounds set it."""


@dataclass
class Rollout:
    """One finished completion (stream `rollouts`)."""

    kind: ClassVar[str] = "rollout"
    rollout_id: str
    """`{group_id}:{sample}`: redeliveries of the same completion share it."""
    group_id: str
    sample: int
    group_size: int
    prompt_ids: np.ndarray
    completion_ids: np.ndarray
    logprobs: np.ndarray
    """Behaviour (sampling) log-prob of each completion token."""
    version: int
    """Weights version that produced the first completion token."""
    version_switches: list = field(default_factory=list)
    """[[token_index, version], ...]: from token_index on, tokens came from `version`."""
    finish_reason: str = "length"
    text: str = ""
    """Decoded completion."""
    prompt_text: str = ""
    meta: dict = field(default_factory=dict)
    worker: str = ""
    finished_at: float = field(default_factory=time.time)

    def oldest_version(self) -> int:
        return min([self.version] + [int(v) for _, v in self.version_switches])

    def token_versions(self) -> np.ndarray:
        out = np.full(len(self.completion_ids), self.version, dtype=np.int64)
        for idx, ver in self.version_switches:
            out[int(idx):] = int(ver)
        return out


@dataclass
class Annotation:
    """A value attached to a rollout under a key (stream `annotations`). Idempotent per (rollout_id, key)."""

    kind: ClassVar[str] = "annotation"
    rollout_id: str
    key: str
    value: Any
    """A float, or packed float32 bytes (unpacked to np.ndarray) for per-token values."""
    producer: str = ""
    error: str = ""
    """Set when the producer could not score this rollout: the assembler drops its group (counted)."""
    parts: dict = field(default_factory=dict)
    """Optional {name: number}: the components a combined `reward` was summed from (reward.components),
    logged per step as reward_components["reward/<name>"]; never trained on separately."""


@dataclass
class Control:
    """Control messages (stream `control`)."""

    kind: ClassVar[str] = "control"
    action: str
    """`stop` (finish and exit), `weights` (a new version is published)."""
    version: int = -1
    reason: str = ""


MESSAGE_TYPES: dict[str, type] = {t.kind: t for t in (Prompt, Rollout, Annotation, Control)}
_ARRAYS = {"prompt_ids": pack_i32, "completion_ids": pack_i32, "logprobs": pack_f32}
_UNPACK = {"prompt_ids": unpack_i32, "completion_ids": unpack_i32, "logprobs": unpack_f32}


def encode(msg: Any) -> bytes:
    """Encode one message to the msgpack map carried in field `d`."""
    data = {"schema": SCHEMA_VERSION, "kind": msg.kind}
    for f in fields(msg):
        value = getattr(msg, f.name)
        if f.name in _ARRAYS:
            value = _ARRAYS[f.name](value)
        elif isinstance(value, np.ndarray):
            value = pack_f32(value)
        data[f.name] = value
    return msgpack.packb(data, use_bin_type=True)


def decode(blob: Any) -> Any:
    """Decode and validate one entry's payload; raise DecodeError with the reason.

    Decoded arrays are read-only views of the payload (np.frombuffer); copy before modifying.
    """
    if not isinstance(blob, (bytes, bytearray)):
        raise DecodeError(f"payload must be bytes, got {type(blob).__name__}")
    if len(blob) > MAX_ENTRY_BYTES:
        raise DecodeError(f"payload of {len(blob)} bytes exceeds the {MAX_ENTRY_BYTES}-byte limit")
    try:
        data = msgpack.unpackb(blob, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise DecodeError(f"not valid msgpack: {exc}") from None
    if not isinstance(data, dict):
        raise DecodeError("payload must be a msgpack map")
    schema = data.pop("schema", None)
    if type(schema) is not int or schema != SCHEMA_VERSION:
        raise DecodeError(f"unknown schema version {schema!r} (this worker reads {SCHEMA_VERSION})")
    kind = data.pop("kind", None)
    cls = MESSAGE_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise DecodeError(f"unknown message kind; expected one of {sorted(MESSAGE_TYPES)}")
    for name, unpack in _UNPACK.items():
        if name in data:
            data[name] = unpack(data[name])
    if cls is Annotation and isinstance(data.get("value"), (bytes, bytearray)):
        data["value"] = unpack_f32(data["value"])
    try:
        msg = cls(**data)
    except TypeError as exc:
        raise DecodeError(f"bad {cls.kind} fields: {exc}") from None
    _validate(msg)
    return msg


def _check(cond: bool, why: str) -> None:
    if not cond:
        raise DecodeError(why)


_FIELD_TYPES = {"str": ((str,), "a string"), "int": ((int,), "an int"), "float": ((int, float), "a number"),
                "dict": ((dict,), "a map"), "list": ((list,), "a list")}
_CHECKS: dict[type, list[tuple[str, tuple, str]]] = {
    cls: [(f.name, _FIELD_TYPES[f.type][0], f"{cls.kind}.{f.name} must be {_FIELD_TYPES[f.type][1]}")
          for f in fields(cls) if f.type in _FIELD_TYPES]
    for cls in MESSAGE_TYPES.values()
}
"""Per message class: (field, accepted types, error) for the plainly typed fields, built once."""


def _all_finite(values: np.ndarray) -> bool:
    """No NaN or inf. A float64 sum of float32 values cannot overflow, so it is finite exactly when
    every value is: one pass, faster than np.isfinite(values).all() on the hot path."""
    return math.isfinite(values.sum(dtype=np.float64))


def _validate(msg: Any) -> None:
    for name, types, why in _CHECKS[type(msg)]:
        value = getattr(msg, name)
        if not isinstance(value, types) or isinstance(value, bool):
            raise DecodeError(why)
    if isinstance(msg, Rollout):
        _check(len(msg.completion_ids) == len(msg.logprobs), "rollout: completion_ids and logprobs differ in length")
        _check(0 <= msg.sample < msg.group_size, "rollout: sample must be in [0, group_size)")
        _check(_all_finite(msg.logprobs), "rollout: logprobs contain NaN or inf")
        for sw in msg.version_switches:
            _check(isinstance(sw, list) and len(sw) == 2 and all(type(x) is int for x in sw),
                   "rollout: version_switches must be [[index, version], ...] of ints")
            _check(0 <= sw[0] <= len(msg.completion_ids), "rollout: a version switch index is outside the completion")
    if isinstance(msg, Prompt):
        _check(msg.group_size >= 1, "prompt: group_size must be >= 1")
        t = msg.temperature
        _check(t is None or (isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t >= 0),
               "prompt: temperature must be null or a number >= 0")
    if isinstance(msg, Annotation):
        v = msg.value
        if isinstance(v, np.ndarray):
            if not _all_finite(v):
                raise DecodeError(f"annotation {msg.key}: values contain NaN or inf")
        elif not isinstance(v, (int, float)) or isinstance(v, bool):
            raise DecodeError(f"annotation {msg.key}: value must be a number or float32 bytes")
        elif not math.isfinite(v):
            raise DecodeError(f"annotation {msg.key}: value is NaN or inf")
        for name, part in msg.parts.items():
            _check(isinstance(name, str) and isinstance(part, (int, float)) and not isinstance(part, bool)
                   and math.isfinite(part), f"annotation {msg.key}: parts must map names to finite numbers")


def as_dict(msg: Any) -> dict:
    """A JSON-friendly view (for logs and the dead-letter stream)."""
    out = asdict(msg)
    for k, v in out.items():
        if isinstance(v, np.ndarray):
            out[k] = v.tolist()
    return out
