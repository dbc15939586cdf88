"""Dead-letter reasons name the writer of a bad annotation, and `up`'s failure line groups them by cause
(issue 42 item 8, issue 43 item 1).

    pytest tests/unit/test_dead_letter_reasons.py -q

docs/protocol.md ("Dead letters") promises that a rejected annotation's reason starts with
`annotation '<key>' from producer '<producer>' for rollout '<rollout_id>':`; the console groups reasons
by what is wrong, not by which of the thousand rollouts it hit, and never cuts a word in two.
"""

from __future__ import annotations

import json

import msgpack
import pytest

from streamrl.assemble.placement import misplaced
from streamrl.core.broker import Keys
from streamrl.core.errors import DecodeError
from streamrl.core.messages import SCHEMA_VERSION, Annotation, decode
from streamrl.launch.failures import CAUSE_CHARS, FailureCounts, cause

WHO = "annotation 'score' from producer 'node-7' for rollout 'g3:1:abc123':"


def payload(**fields) -> bytes:
    base = {"kind": "annotation", "rollout_id": "g3:1:abc123", "key": "score", "producer": "node-7", "value": 1.0}
    return msgpack.packb({k: v for k, v in {**base, **fields}.items() if v is not None})


def reason(blob: bytes, expect=None) -> str:
    with pytest.raises(DecodeError) as info:
        decode(blob, expect)
    return str(info.value)


@pytest.mark.parametrize("expect", [None, Annotation])
def test_a_wrong_schema_names_the_writer(expect):
    got = reason(payload(schema=SCHEMA_VERSION + 1), expect)
    assert got.startswith(f"{WHO} unknown schema version {SCHEMA_VERSION + 1}"), got


@pytest.mark.parametrize("expect", [None, Annotation])
def test_a_missing_schema_is_a_missing_field(expect):
    got = reason(payload(), expect)
    assert got.startswith(f"{WHO} missing required field schema"), got
    assert "None" not in got and f"schema: {SCHEMA_VERSION}" in got


def test_other_kinds_keep_their_reason_without_an_annotation_prefix():
    got = reason(msgpack.packb({"kind": "rollout", "group_id": "g1"}))
    assert got.startswith("missing required field schema"), got
    got = reason(msgpack.packb({"schema": SCHEMA_VERSION, "kind": "rollout"}), Annotation)
    assert got.startswith("a rollout message does not belong on this stream"), got


def test_a_wrong_partition_annotation_names_the_writer():
    keys = Keys("tiny", partitions=3)
    msg = Annotation(rollout_id="g3:1:abc123", key="score", value=1.0, producer="node-7")
    right = keys.partition_of("g3")
    wrong = keys.annotation_streams[(right + 1) % 3]
    got = misplaced(keys, wrong, msg)
    assert got.startswith(f"{WHO} entry of group 'g3' on {wrong}"), got
    assert misplaced(keys, keys.annotation_streams[right], msg) == ""


def _records(reasons):
    return [{"reason": r, "worker": "assembler-0", "stream": "s"} for r in reasons]


def test_nine_bad_annotations_are_one_cause_and_700_episode_failures_are_one():
    counts = FailureCounts()
    for i in range(9):
        counts.add({"reason": f"annotation 'score' from producer 'node-7' for rollout 'g{i}:0:ab{i}': value is nan"})
    for i in range(700):
        counts.add({"reason": f"episode g{i}:{i % 8}:e727c6{i} turn {i % 3}: env step raised KeyError: 'x'"})
    assert len(counts.by_cause) == 2, counts.by_cause
    line = counts.line()
    assert "annotation 'score' from producer 'node-7' for rollout <id>: value is nan: 9" in line
    assert "episode <id> turn N: env step raised KeyError: 700" in line and "more causes" not in line
    # different writers or different faults stay apart
    assert cause("annotation 'score' from producer 'a' for rollout 'g1:0:x': value is nan") != cause(
        "annotation 'score' from producer 'b' for rollout 'g1:0:x': value is nan"
    )


def test_causes_are_cut_at_word_boundaries():
    long = "reward function returned " + " ".join(f"word{i}" for i in range(60))
    got = cause(long)
    assert len(got) <= CAUSE_CHARS + 4 and got.endswith(" ...")
    assert long.startswith(got.removesuffix(" ...")) and long[len(got) - 4] == " "  # a whole word, then the cut
    assert cause("token ids outside the vocabulary [0, 5)") == "token ids outside the vocabulary [0, 5)"


def test_the_first_reason_is_kept_whole_on_the_line():
    counts = FailureCounts()
    first = f"{WHO} unknown schema version 2 (this worker reads 1)"
    counts.add(json.loads(json.dumps(_records([first])[0])))
    assert f"first: {first}" in counts.line()
