"""Which partition an entry belongs on: an entry on another partition's stream is an external producer's bug."""

from __future__ import annotations

from streamrl.core.messages import Annotation, Rollout, parse_rollout_id


def misplaced(keys, stream: str, msg) -> str:
    """Why an entry is on the wrong partition (an external producer's bug): the trainer acks a group's
    entries on its own partition, so one elsewhere would stay pending for ever."""
    if keys.partitions == 1:
        return ""
    group_id = msg.group_id if isinstance(msg, Rollout) else parse_rollout_id(msg.rollout_id)[0]
    want = keys.partition_of(group_id)
    if stream in (keys.rollout_streams[want], keys.annotation_streams[want]):
        return ""
    who = (
        f"annotation {msg.key!r} from producer {msg.producer!r} for rollout {msg.rollout_id!r}: "
        if isinstance(msg, Annotation)
        else ""
    )
    return who + (
        f"entry of group {group_id!r} on {stream}, but the group's partition is {want} of "
        f"{keys.partitions} (crc32 of the group id mod rollout.partitions, docs/protocol.md "
        '"Partitions"); write it to that partition\'s stream'
    )
