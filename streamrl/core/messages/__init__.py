"""Every wire type, its schema version, and its msgpack encoding: the one import path for all of it.

    from streamrl.core.messages import Rollout, encode, decode
    blob = encode(Rollout(...)); msg = decode(blob)   # raises DecodeError on anything malformed

One responsibility a file: `types.py` the dataclasses (one per message kind), `codec.py` encode/decode
(nothing else touches raw fields), `validate.py` the checks a decoded message passes, `ids.py` the
rollout and eval-group id formats. The contract is docs/protocol.md.
"""

from streamrl.core.messages.codec import (
    FIELD,
    MAX_ENTRY_BYTES,
    SCHEMA_VERSION,
    as_dict,
    decode,
    decode_with_extras,
    encode,
    pack_f32,
    pack_i32,
    peek_field,
    unpack_f32,
    unpack_i32,
)
from streamrl.core.messages.ids import (
    EVAL_PREFIX,
    eval_group_id,
    eval_group_of,
    is_eval_group,
    new_rollout_id,
    parse_eval_group,
    parse_rollout_id,
    sample_key,
)
from streamrl.core.messages.types import (
    MESSAGE_TYPES,
    Annotation,
    Control,
    EpisodeState,
    Observation,
    Prompt,
    Rollout,
    StepRequest,
)

__all__ = [
    "FIELD",
    "MAX_ENTRY_BYTES",
    "SCHEMA_VERSION",
    "as_dict",
    "decode",
    "decode_with_extras",
    "encode",
    "pack_f32",
    "pack_i32",
    "peek_field",
    "unpack_f32",
    "unpack_i32",
    "EVAL_PREFIX",
    "eval_group_id",
    "eval_group_of",
    "is_eval_group",
    "new_rollout_id",
    "parse_eval_group",
    "parse_rollout_id",
    "sample_key",
    "MESSAGE_TYPES",
    "Annotation",
    "Control",
    "EpisodeState",
    "Observation",
    "Prompt",
    "Rollout",
    "StepRequest",
]
