"""The msgpack encoding of every wire type and its schema version. Nothing else touches raw fields.

A stream entry has one field, `d`, holding a msgpack map with `schema` (int) and `kind` (str).
Token ids travel as packed little-endian int32, log-probs as packed little-endian float32
(`bytes` in msgpack), so a producer in any language can read them. Never pickle.

    blob = encode(Rollout(...)); msg = decode(blob)   # raises DecodeError on anything malformed
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, fields
from typing import Any

import msgpack
import numpy as np

from streamrl.core.errors import DecodeError
from streamrl.core.messages.types import MESSAGE_TYPES, Annotation, Observation
from streamrl.core.messages.validate import check_types, validate

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


_WIRE_REQUIRED = {Observation: ["text", "reward", "done"]}
"""Fields with a Python default (so the env worker's error answers are short to build) that every
written entry must still carry: a reward or done an env forgot must not be trained as 0.0 / false."""
_REQUIRED = {
    cls: [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
    + _WIRE_REQUIRED.get(cls, [])
    for cls in MESSAGE_TYPES.values()
}
_REQUIRED_SET = {cls: frozenset(names) for cls, names in _REQUIRED.items()}
_KNOWN = {cls: frozenset(f.name for f in fields(cls)) for cls in MESSAGE_TYPES.values()}


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


def decode(blob: Any, expect: type | None = None) -> Any:
    """Decode and validate one entry's payload; raise DecodeError with the reason.

    `expect`: the message class the stream carries; another kind is rejected before its fields are
    looked at. Fields this schema does not know are ignored (docs/protocol.md, "Versioning"): use
    `decode_with_extras` to see them. Decoded arrays are read-only views of the payload
    (np.frombuffer); copy before modifying.
    """
    return decode_with_extras(blob, expect)[0]


def peek_field(blob: Any, name: str) -> Any:
    """Field `name` of a payload that may not decode (None when it cannot be read): what a reader
    needs to tell whom a rejected entry was meant for."""
    try:
        data = msgpack.unpackb(blob, raw=False)
    except Exception:  # not msgpack (or not bytes): nobody can be named
        return None
    return data.get(name) if isinstance(data, dict) else None


def decode_with_extras(blob: Any, expect: type | None = None) -> tuple[Any, list[str]]:
    """`decode`, plus the names of the fields it ignored (written by a newer writer, or misspelt)."""
    if not isinstance(blob, (bytes, bytearray)):
        raise DecodeError(f"payload must be bytes, got {type(blob).__name__}")
    if len(blob) > MAX_ENTRY_BYTES:
        raise DecodeError(f"payload of {len(blob)} bytes exceeds the {MAX_ENTRY_BYTES}-byte limit")
    try:
        data = msgpack.unpackb(blob, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types, some with an empty message
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise DecodeError(
            f"not valid msgpack ({detail}); the payload starts with {bytes(blob[:16]).hex(' ')!r}. "
            "Field `d` must hold one msgpack map (docs/protocol.md, Entries)"
        ) from None
    if not isinstance(data, dict):
        raise DecodeError(f"payload must be a msgpack map, got a msgpack {type(data).__name__}")
    kind = data.get("kind")
    other = isinstance(kind, str) and kind in MESSAGE_TYPES and kind != "annotation"
    annotation = kind == "annotation" or (expect is Annotation and not other)
    try:
        return _decode_map(data, expect)
    except DecodeError as exc:
        if annotation:
            # name the writer (docs/protocol.md, "Dead letters"): its key and producer, as far as they can be read
            who = {f: data.get(f, "?") for f in ("key", "producer", "rollout_id")}
            raise DecodeError(
                f"annotation {who['key']!r} from producer {who['producer']!r} for rollout {who['rollout_id']!r}: {exc}"
            ) from None
        raise


def _decode_map(data: dict, expect: type | None) -> tuple[Any, list[str]]:
    if "schema" not in data:
        raise DecodeError(
            f"missing required field schema (it has {', '.join(sorted(map(str, data))) or 'no fields'}); "
            f"every payload carries schema: {SCHEMA_VERSION} (docs/protocol.md, Entries)"
        )
    schema = data.pop("schema")
    if type(schema) is not int or schema != SCHEMA_VERSION:
        raise DecodeError(f"unknown schema version {schema!r} (this worker reads {SCHEMA_VERSION})")
    kind = data.pop("kind", None)
    cls = MESSAGE_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise DecodeError(f"unknown message kind {kind!r}; expected one of {sorted(MESSAGE_TYPES)}")
    if expect is not None and cls is not expect:
        article = "an" if cls.kind[0] in "aeiou" else "a"
        raise DecodeError(
            f"{article} {cls.kind} message does not belong on this stream (expected kind {expect.kind!r})"
        )
    return _build(cls, data)


def _build(cls: type, data: dict) -> tuple[Any, list[str]]:
    known = _KNOWN[cls]
    if not data.keys() >= _REQUIRED_SET[cls]:
        missing = [name for name in _REQUIRED[cls] if name not in data]
        raise DecodeError(
            f"{cls.kind} is missing required field(s) {', '.join(missing)} "
            f"(it has {', '.join(sorted(map(str, data))) or 'no fields'}); see docs/protocol.md"
        )
    extras: list = []
    if not known.issuperset(data):  # rare (a newer writer's fields): only then is a filtered copy needed
        extras = [name for name in data if name not in known]
        data = {name: value for name, value in data.items() if name in known}
    check_types(cls, data)  # before construction, on the decoded values: a field absent is its (valid) default
    for name in _UNPACK.keys() & data.keys():
        data[name] = _UNPACK[name](data[name])
    if cls is Annotation and isinstance(data.get("value"), (bytes, bytearray)):
        data["value"] = unpack_f32(data["value"])
    msg = cls(**data)
    validate(msg)
    return msg, sorted(map(str, extras))


def _check(cond: bool, why: str) -> None:
    if not cond:
        raise DecodeError(why)


def as_dict(msg: Any) -> dict:
    """A JSON-friendly view (for logs and the dead-letter stream)."""
    out = asdict(msg)
    for k, v in out.items():
        if isinstance(v, np.ndarray):
            out[k] = v.tolist()
    return out
