"""The wire codec (streamrl/core/messages/): round trips, the packed-array format, and rejections.

pytest tests/unit/test_messages.py
"""

from __future__ import annotations

import struct
from dataclasses import fields

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrl.core.errors import DecodeError
from streamrl.core.messages import (
    MAX_ENTRY_BYTES,
    SCHEMA_VERSION,
    Annotation,
    Control,
    Prompt,
    Rollout,
    decode,
    encode,
    pack_f32,
    pack_i32,
)


def _rollout(**kw) -> Rollout:
    base = dict(
        rollout_id="g7:1",
        group_id="g7",
        sample=1,
        group_size=4,
        prompt_ids=np.array([5, 6, 7]),
        completion_ids=np.array([1, -2, 70000]),
        logprobs=np.array([-0.25, -1.5, -3.0]),
        version=3,
        version_switches=[[2, 4]],
        finish_reason="stop",
        text="abc",
        meta={"answer": "42"},
        worker="gen-0",
    )
    return Rollout(**{**base, **kw})


def _same(a, b) -> bool:
    if type(a) is not type(b):
        return False
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if not np.array_equal(np.asarray(x), np.asarray(y)):
                return False
        elif x != y:
            return False
    return True


def _raw(msg) -> dict:
    return msgpack.unpackb(encode(msg), raw=False)


def _blob(data: dict) -> bytes:
    return msgpack.packb(data, use_bin_type=True)


@pytest.mark.parametrize(
    "msg",
    [
        Prompt(
            group_id="g1",
            prompt_ids=np.array([1, 2, 3]),
            group_size=8,
            admitted_version=2,
            text="hi",
            meta={"answer": 3},
            index=11,
        ),
        _rollout(),
        _rollout(
            completion_ids=np.array([], dtype=np.int32), logprobs=np.array([], dtype=np.float32), version_switches=[]
        ),
        Annotation(rollout_id="g7:1", key="reward", value=0.75, producer="reward-0"),
        Annotation(rollout_id="g7:1", key="ref_logprobs", value=np.array([-0.5, -1.0], dtype=np.float32)),
        Control(action="weights", version=5, reason="published"),
    ],
    ids=lambda m: m.kind,
)
def test_round_trip(msg):
    back = decode(encode(msg))
    assert _same(back, msg)
    assert _raw(msg)["schema"] == SCHEMA_VERSION and _raw(msg)["kind"] == msg.kind


def test_rollout_helpers_survive_the_wire():
    back = decode(encode(_rollout()))
    assert back.oldest_version() == 3
    assert back.token_versions().tolist() == [3, 3, 4]
    assert back.completion_ids.dtype == np.int32 and back.logprobs.dtype == np.float32


def test_arrays_are_packed_little_endian_int32_and_float32():
    raw = _raw(_rollout())
    assert raw["completion_ids"] == struct.pack("<3i", 1, -2, 70000)
    assert raw["prompt_ids"] == struct.pack("<3i", 5, 6, 7)
    assert raw["logprobs"] == struct.pack("<3f", -0.25, -1.5, -3.0)
    per_token = _raw(Annotation(rollout_id="r", key="ref_logprobs", value=np.array([0.5, -2.0])))
    assert per_token["value"] == struct.pack("<2f", 0.5, -2.0)
    assert pack_i32([1, 2]) == b"\x01\x00\x00\x00\x02\x00\x00\x00"
    assert pack_f32([1.0]) == struct.pack("<f", 1.0)


def _with(msg, **changes) -> bytes:
    return _blob({**_raw(msg), **changes})


@pytest.mark.parametrize(
    "blob, reason",
    [
        (_with(Control(action="stop"), schema=SCHEMA_VERSION + 1), "unknown schema version"),
        (_blob({"kind": "control", "action": "stop"}), "missing required field schema"),
        (_with(Control(action="stop"), kind="telegram"), "unknown message kind"),
        (_with(Control(action="stop"), version="3"), "control.version must be an int"),
        (_with(Control(action="stop"), version=True), "control.version must be an int"),
        (_with(_rollout(), group_id=7), "rollout.group_id must be a string"),
        (_with(_rollout(), meta=[1, 2]), "rollout.meta must be a map"),
        (_with(_rollout(), version_switches={"2": 4}), "rollout.version_switches must be a list"),
        (_with(_rollout(), version_switches=[[2]]), "version_switches must be"),
        (_with(_rollout(), logprobs=pack_f32([-0.1, float("nan"), -0.3])), "NaN or inf"),
        (_with(_rollout(), logprobs=pack_f32([-0.1, float("-inf"), -0.3])), "NaN or inf"),
        (_with(_rollout(), logprobs=pack_f32([-0.1, -0.2])), "differ in length"),
        (_with(_rollout(), completion_ids=b"\x01\x02\x03"), "divisible by 4"),
        (_with(_rollout(), completion_ids=[1, 2, 3]), "int32 array must be bytes"),
        (_with(_rollout(), sample=4), "sample must be in [0, group_size)"),
        (_blob({"schema": SCHEMA_VERSION, "kind": "rollout", "rollout_id": "x"}), "missing required field(s) group_id"),
        (
            _with(Prompt(group_id="g", prompt_ids=np.array([1]), group_size=1, admitted_version=0), group_size=0),
            "group_size must be >= 1",
        ),
        (_with(Annotation(rollout_id="r", key="reward", value=1.0), value=float("nan")), "NaN or inf"),
        (_with(Annotation(rollout_id="r", key="reward", value=1.0), value="0.5"), "must be a number"),
        (_with(Annotation(rollout_id="r", key="reward", value=1.0), value=1e39), "beyond the float32 range"),
        (_with(Annotation(rollout_id="r", key="reward", value=1.0), value=True), "must be a number"),
        (_with(Annotation(rollout_id="r", key="k", value=1.0), value=pack_f32([1.0, float("inf")])), "NaN or inf"),
        (b"\xc1\xc1 definitely not msgpack", "not valid msgpack"),
        (msgpack.packb([1, 2, 3]), "must be a msgpack map"),
        (msgpack.packb({1: "int key"}), "not valid msgpack"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_malformed_payloads_raise_decode_error_with_the_reason(blob, reason):
    with pytest.raises(DecodeError) as err:
        decode(blob)
    assert reason in str(err.value)


def test_non_bytes_and_oversized_payloads_are_rejected_before_parsing():
    with pytest.raises(DecodeError, match="payload must be bytes"):
        decode("a str")
    with pytest.raises(DecodeError, match="exceeds"):
        decode(b"\x00" * (MAX_ENTRY_BYTES + 1))


def test_unhashable_kind_is_a_decode_error():
    with pytest.raises(DecodeError):
        decode(_with(Control(action="stop"), kind=["control"]))


def test_boolean_schema_is_rejected():
    with pytest.raises(DecodeError):
        decode(_with(Control(action="stop"), schema=True))


def test_float_field_type_is_checked():
    with pytest.raises(DecodeError):
        decode(_with(_rollout(), finished_at="yesterday"))


def test_version_switch_items_must_be_ints():
    with pytest.raises(DecodeError):
        decode(_with(_rollout(), version_switches=[["two", 4]]))


def test_version_switch_index_must_lie_in_the_completion():
    with pytest.raises(DecodeError, match="outside the completion"):
        decode(_with(_rollout(), version_switches=[[10_000, 4]]))


_ids = st.lists(st.integers(-(2**31), 2**31 - 1), max_size=40)
_logprob = st.floats(-1e4, 0.0, allow_nan=False, width=32)


@st.composite
def rollouts(draw) -> Rollout:
    completion = draw(_ids)
    size = draw(st.integers(1, 16))
    n = len(completion)
    switch_at = sorted(draw(st.lists(st.integers(0, n), max_size=3)))
    return Rollout(
        rollout_id=draw(st.text(max_size=20)),
        group_id=draw(st.text(max_size=20)),
        sample=draw(st.integers(0, size - 1)),
        group_size=size,
        prompt_ids=np.array(draw(_ids), dtype=np.int32),
        completion_ids=np.array(completion, dtype=np.int32),
        logprobs=np.array(draw(st.lists(_logprob, min_size=n, max_size=n)), dtype=np.float32),
        version=draw(st.integers(0, 2**40)),
        version_switches=[[i, draw(st.integers(0, 2**40))] for i in switch_at],
        finish_reason=draw(st.sampled_from(["stop", "length", "abort"])),
        text=draw(st.text(max_size=50)),
        meta=draw(
            st.dictionaries(st.text(max_size=8), st.integers(-(2**63), 2**64 - 1) | st.text(max_size=8), max_size=3)
        ),
        finished_at=draw(st.floats(0, 2e9)),
    )


@settings(max_examples=150, deadline=None)
@given(rollouts())
def test_rollout_round_trip_property(msg):
    assert _same(decode(encode(msg)), msg)


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=30), st.floats(-3.4e38, 3.4e38) | st.integers(-(2**63), 2**63 - 1))
def test_scalar_annotation_round_trip_property(key, value):
    msg = Annotation(rollout_id="r", key=key, value=value)
    assert decode(encode(msg)) == msg


def test_huge_finite_logprobs_are_not_mistaken_for_inf():
    """The finiteness check sums the values; a float32 sum of these would overflow to -inf."""
    lp = np.full(3, -3.0e38, dtype=np.float32)
    got = decode(encode(_rollout(logprobs=lp)))
    assert np.array_equal(got.logprobs, lp)


def test_the_wrong_kind_is_named_with_its_article():
    # an annotation is named by its writer first, wherever it was written (docs/protocol.md, "Dead letters")
    with pytest.raises(
        DecodeError, match="^annotation 'reward' from producer '' for rollout 'r': an annotation message"
    ):
        decode(encode(Annotation(rollout_id="r", key="reward", value=1.0)), expect=Rollout)
    with pytest.raises(DecodeError, match="^a control message does not belong"):
        decode(encode(Control(action="stop")), expect=Rollout)


def test_every_wire_field_is_in_the_protocol_doc():
    """docs/protocol.md's field tables name every field of the wire types (Annotation's `text` included), so
    a producer written from the doc alone can send and read all of them."""
    import re
    from pathlib import Path

    from streamrl.core.messages import Annotation, Prompt, Rollout

    doc = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
    named = set(re.findall(r"^\| `([a-z_]+)` \|", doc, re.M))
    missing = {
        cls.__name__: [f.name for f in fields(cls) if f.name not in named] for cls in (Prompt, Rollout, Annotation)
    }
    assert missing == {"Prompt": [], "Rollout": [], "Annotation": []}
