"""Every wire type, its schema version, and its msgpack encoding. Nothing else touches raw fields.

A stream entry has one field, `d`, holding a msgpack map with `schema` (int) and `kind` (str).
Token ids travel as packed little-endian int32, log-probs as packed little-endian float32
(`bytes` in msgpack), so a producer in any language can read them. Never pickle.

    blob = encode(Rollout(...)); msg = decode(blob)   # raises DecodeError on anything malformed
"""

from __future__ import annotations

import functools
import math
import re
import time
import uuid
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, ClassVar

import msgpack
import numpy as np

from streamrl.core.errors import DecodeError

EVAL_PREFIX = "eval-"
"""Group ids of evaluation rounds start with this (streamrl/eval/rounds.py issues them): such groups are
scored but never trained, so the accounting, the reference worker and the assembler tell them apart by id."""


def is_eval_group(group_id: str) -> bool:
    return group_id.startswith(EVAL_PREFIX)


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
    """`{group_id}:{sample}:{nonce}` (new_rollout_id): names exactly one generated completion; a
    regenerated sample (a restarted generator) gets a new nonce, a redelivered entry keeps its id."""
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
    obs_spans: list = field(default_factory=list)
    """[[start, end], ...]: completion tokens [start, end) are environment observations of a
    multi-turn episode (loss mask 0, log-prob 0); empty for a single-turn completion."""

    def oldest_version(self) -> int:
        return min([self.version] + [int(v) for _, v in self.version_switches])

    def token_versions(self) -> np.ndarray:
        out = np.full(len(self.completion_ids), self.version, dtype=np.int64)
        for idx, ver in self.version_switches:
            out[int(idx) :] = int(ver)
        return out

    def token_mask(self) -> np.ndarray:
        """1.0 on model-sampled completion tokens, 0.0 on observation tokens (float32)."""
        out = np.ones(len(self.completion_ids), dtype=np.float32)
        for start, end in self.obs_spans:
            out[int(start) : int(end)] = 0.0
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


@dataclass
class StepRequest:
    """One environment step of a multi-turn episode (stream `env_steps`, read by env workers).

    Carries everything a replayable env needs to rebuild its state on any worker: the task item
    and every action so far (the last one is the action to step with)."""

    kind: ClassVar[str] = "step_request"
    episode_id: str
    """`{group_id}:{sample}:{attempt nonce}`: a restarted episode gets a new one."""
    group_id: str
    sample: int
    turn: int
    """0-based index of this step; equals len(actions) - 1."""
    item: dict
    """The task item: {"text": prompt text, "meta": task data}."""
    actions: list
    """Text of each model turn so far (strings), the newest last."""
    reply_to: str
    """Generator id: the observation goes to stream `observations:{reply_to}`."""
    sent_at: float = field(default_factory=time.time)


@dataclass
class Observation:
    """An env worker's answer to one StepRequest (stream `observations:{generator id}`)."""

    kind: ClassVar[str] = "observation"
    episode_id: str
    turn: int
    text: str = ""
    """What the environment says; the generator tokenizes it and appends it to the episode."""
    reward: float = 0.0
    """This step's reward (the episode's env reward is the sum over its steps)."""
    done: bool = False
    error: str = ""
    """Set when the step failed (env raised, timed out, returned garbage): the episode fails."""
    error_kind: str = ""
    """`replay` when the env lost its state and cannot replay (the episode restarts), else empty."""
    env_worker: str = ""
    step_s: float = 0.0
    """Seconds the env itself took for this step (replay included)."""
    messages: list = field(default_factory=list)
    """Chat messages [{role, content}] this step appends (tool results, a user turn): a generator with
    tools.chat renders them with the model's chat template; empty: `text` is the observation."""
    counts: dict = field(default_factory=dict)
    """Numeric counters of this step (e.g. tool_calls, tool_errors), summed over the episode into metrics."""


@dataclass
class EpisodeState:
    """A multi-turn episode's checkpoint, written by its generator after each model turn (hash
    `episode_state:{group_id}`, field = sample): what another generator needs to continue the
    episode from that turn if this one dies (streamrl/generate/episode_runner.py). Not a stream entry."""

    kind: ClassVar[str] = "episode_state"
    episode_id: str
    """The attempt that wrote it; a continuation runs under a new nonce."""
    group_id: str
    sample: int
    turn: int
    """The model turn just sampled, whose env step is pending; equals len(actions) - 1."""
    prompt_ids: np.ndarray
    completion_ids: np.ndarray
    """Every model and observation token so far, in order (the exact history)."""
    logprobs: np.ndarray
    version: int
    version_switches: list = field(default_factory=list)
    obs_spans: list = field(default_factory=list)
    actions: list = field(default_factory=list)
    """Text of each model turn so far (the step requests' actions)."""
    texts: list = field(default_factory=list)
    """Model turn and observation texts in order (the rollout's text)."""
    step_s: list = field(default_factory=list)
    env_reward: float = 0.0
    counts: dict = field(default_factory=dict)
    """The env's counters summed over the steps so far (tool_calls, tool_errors, ...)."""
    writer: str = ""
    """Generator id that wrote it (logs)."""


MESSAGE_TYPES: dict[str, type] = {
    t.kind: t for t in (Prompt, Rollout, Annotation, Control, StepRequest, Observation, EpisodeState)
}
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
_F32_MAX = float(np.finfo(np.float32).max)

_ROLLOUT_ID = re.compile(r"(?P<group>.+):(?P<sample>0|[1-9][0-9]*):(?P<nonce>[A-Za-z0-9]{1,32})")


def new_rollout_id(group_id: str, sample: int) -> str:
    """A fresh id for one generated completion: `{group_id}:{sample}:{nonce}` (12 random hex digits).

    Minted once per completion, so a sample that is generated again (its generator crashed before
    the group's prompt was acked) never shares an id with the first copy."""
    return f"{group_id}:{sample}:{uuid.uuid4().hex[:12]}"


@functools.lru_cache(maxsize=16_384)
def parse_rollout_id(rollout_id: str) -> tuple[str, int] | None:
    """(group_id, sample) of a well-formed rollout id, else None. Cached: the assembler parses each id
    of a rollout and its annotations several times (validity, join, eval routing)."""
    m = _ROLLOUT_ID.fullmatch(rollout_id)
    return (m["group"], int(m["sample"])) if m else None


def sample_key(rollout_id: str) -> str:
    """`{group_id}:{sample}` of a rollout id: what two copies of one sample have in common."""
    parsed = parse_rollout_id(rollout_id)
    return f"{parsed[0]}:{parsed[1]}" if parsed else rollout_id


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
    schema = data.pop("schema", None)
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
    try:
        return _build(cls, data)
    except DecodeError as exc:
        if cls is Annotation:  # name the writer: its key and producer, as far as they can be read
            who = {f: data.get(f, "?") for f in ("key", "producer", "rollout_id")}
            raise DecodeError(
                f"annotation {who['key']!r} from producer {who['producer']!r} for rollout {who['rollout_id']!r}: {exc}"
            ) from None
        raise


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
    _check_types(cls, data)  # before construction, on the decoded values: a field absent is its (valid) default
    for name in _UNPACK.keys() & data.keys():
        data[name] = _UNPACK[name](data[name])
    if cls is Annotation and isinstance(data.get("value"), (bytes, bytearray)):
        data["value"] = unpack_f32(data["value"])
    msg = cls(**data)
    _validate(msg)
    return msg, sorted(map(str, extras))


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


def _check_types(cls: type, data: dict) -> None:
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


def _validate(msg: Any) -> None:
    """The checks across fields (the plain types are _check_types', on the decoded map)."""
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


def as_dict(msg: Any) -> dict:
    """A JSON-friendly view (for logs and the dead-letter stream)."""
    out = asdict(msg)
    for k, v in out.items():
        if isinstance(v, np.ndarray):
            out[k] = v.tolist()
    return out
