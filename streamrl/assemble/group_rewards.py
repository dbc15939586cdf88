"""The rewards of a complete group (streamrl/assemble/assembler.py): its annotations joined per
key in sample order (the join policy: built-in `reward`, external keys, the judge), combined into
one reward per rollout, DAPO's soft overlong penalty added where configured.

    rewards = group_rewards(group, annotations, join, cfg)   # np.ndarray, sample order
"""

from __future__ import annotations

import numpy as np

from streamrl.assemble.advantages import overlong_penalty
from streamrl.assemble.join_policy import JoinPolicy
from streamrl.assemble.pending_group import PendingGroup
from streamrl.config.schema import Config

Annotations = dict
"""rollout_id -> {key: (entry id, Annotation)}: what the assembler has joined."""


def reward_errors(g: PendingGroup, annotations: Annotations) -> list[str]:
    """The reward errors of a group whose every rollout's reward errored, else []."""
    errors = [annotations[rid]["reward"][1].error for rid in g.rollouts]
    return errors if all(errors) else []


def group_components(g: PendingGroup, annotations: Annotations, join: JoinPolicy) -> dict[str, np.ndarray]:
    """Each reward key's values (built-in `reward`, external keys) in sample order."""
    return join.components([{k: a for k, (_, a) in annotations[r.rollout_id].items()} for r in g.ordered()])


def group_rewards(g: PendingGroup, annotations: Annotations, join: JoinPolicy, cfg: Config) -> np.ndarray:
    """Rewards of a group's rollouts in sample order, with DAPO's soft overlong penalty if configured."""
    rewards = join.combine(group_components(g, annotations, join))
    loss = cfg.loss
    if loss.overlong_buffer > 0:
        lengths = np.asarray([len(r.completion_ids) for r in g.ordered()])
        rewards = rewards + overlong_penalty(
            lengths, cfg.generator.max_tokens, loss.overlong_buffer, loss.overlong_penalty
        ).astype(np.float32)
    return rewards


def annotation_texts(joined: list[dict]) -> dict[str, list[str]]:
    """Key -> each rollout's annotation text, for the keys with any text (the judge's replies); `joined`:
    each rollout's {key: (entry id, Annotation)}; pure."""
    keys = {k for a in joined for k, (_, ann) in a.items() if getattr(ann, "text", "")}
    return {k: [getattr(a[k][1], "text", "") if k in a else "" for a in joined] for k in sorted(keys)}
