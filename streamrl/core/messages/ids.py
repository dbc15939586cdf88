"""Ids on the wire: a rollout id names one generated completion; an eval group id names one prompt of an
evaluation round. Both are read by id alone (accounting, the reference worker, the assembler).

    rid = new_rollout_id("g7", 1)        # "g7:1:<nonce>"; parse_rollout_id(rid) == ("g7", 1)
    gid = eval_group_id(10, 16, 3)       # "eval-10-16-3"; parse_eval_group(gid) == (10, 16, 3)
"""

from __future__ import annotations

import functools
import re
import uuid

EVAL_PREFIX = "eval-"
"""Group ids of evaluation rounds start with this (streamrl/eval/rounds.py issues them): such groups are
scored but never trained, so the accounting, the reference worker and the assembler tell them apart by id."""


_EVAL_ID = re.compile(r"^eval-(\d+)-(\d+)-(\d+)$")


def is_eval_group(group_id: str) -> bool:
    return group_id.startswith(EVAL_PREFIX)


def eval_group_id(version: int, n: int, i: int) -> str:
    """The group id of prompt `i` of the `n` prompts of the eval round issued at trainer version `version`."""
    return f"{EVAL_PREFIX}{version}-{n}-{i}"


def parse_eval_group(group_id: str) -> tuple[int, int, int] | None:
    """(version, prompts in the round, index) of an eval group id; None for a training group."""
    m = _EVAL_ID.match(group_id)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def eval_group_of(rollout_id: str) -> str | None:
    """The eval group id a rollout id belongs to (rollout ids start with '<group_id>:'), else None."""
    if not rollout_id.startswith(EVAL_PREFIX):
        return None
    group = rollout_id.split(":", 1)[0]
    return group if _EVAL_ID.match(group) else None


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
