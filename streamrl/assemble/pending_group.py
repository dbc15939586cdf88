"""A group the trainer's assembler is still joining (streamrl/assemble/assembler.py): which copy of each sample
it trains, when it filled, and whether a rollout read for it can join it at all."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from streamrl.core.messages import Rollout, parse_rollout_id


@dataclass
class PendingGroup:
    group_id: str
    group_size: int
    rollouts: dict[str, tuple[str, Rollout]] = field(default_factory=dict)
    """rollout_id -> (entry id, rollout): the copy of each sample that is trained."""
    samples: dict[int, str] = field(default_factory=dict)
    """sample -> rollout_id of its trained copy."""
    superseded: set[str] = field(default_factory=set)
    """Ids of later copies of a sample (acked when read; so are their annotations)."""
    completed_at: float = 0.0
    full_at: float = 0.0
    """When its last rollout arrived: external annotation timeouts count from here."""
    oldest: int | None = None
    """Oldest token version among its rollouts (cached once the group is ready)."""

    def ordered(self) -> list[Rollout]:
        """Its trained rollouts in sample order."""
        return [r for _, r in sorted(self.rollouts.values(), key=lambda er: er[1].sample)]


def rollout_problem(msg: Rollout, group: PendingGroup | None, vocab_size: int | None) -> str:
    """Why a decodable rollout still cannot be used ("" when it can): it would break its group
    (`group`, None when none of its samples was read yet) or the train step."""
    if parse_rollout_id(msg.rollout_id) != (msg.group_id, msg.sample):
        return (
            f"rollout_id {msg.rollout_id!r} is not '<group_id>:<sample>:<nonce>' for group "
            f"{msg.group_id!r}, sample {msg.sample} (streamrl.core.messages.new_rollout_id)"
        )
    if len(msg.prompt_ids) == 0:
        return "rollout has an empty prompt"
    if group is not None and group.group_size != msg.group_size:
        return f"group_size {msg.group_size} differs from the group's {group.group_size}"
    ids = np.concatenate([msg.prompt_ids, msg.completion_ids])
    if ids.min() < 0 or (vocab_size is not None and ids.max() >= vocab_size):
        return f"token ids outside the vocabulary [0, {vocab_size})"
    return ""
