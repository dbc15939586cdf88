"""Staleness rules (pure): the feeder's admission bound and the assembler's filter.

Trainer version v = optimizer steps applied. A group admitted while the trainer is at version v
is generated with weights >= v, and is trained at version ~ its batch index, so bounding
admissions bounds staleness (AReaL's rule). The assembler re-checks at batch time.

The admission bound is exact only while groups complete in the order they were admitted: the
group at admission position p (counted from the trainer's current step) is trained at step
v + p // groups_per_step <= v + max_staleness, and its oldest token is at least v. A group that
completes after groups admitted behind it can miss its step and is dropped; `due_first` orders a
batch's candidates by deadline so that a group about to become stale is taken before a fresher
one (docs/architecture.md, "Admission and staleness").
"""

from __future__ import annotations

from collections import Counter

import numpy as np


def admission_budget(
    admitted: int,
    released: int,
    version: int,
    max_staleness: int,
    groups_per_step: int,
    total_groups: int | None = None,
) -> int:
    """How many more groups the feeder may admit now.

    `released` counts groups that will never be trained (dropped as stale, filtered, failed):
    they free their slot so the trainer is never starved. Admission is allowed while
    `admitted - released < (version + max_staleness + 1) * groups_per_step`, and never beyond
    `total_groups` live groups (the whole run's need).
    """
    live = admitted - released
    limit = (version + max_staleness + 1) * groups_per_step
    if total_groups is not None:
        limit = min(limit, total_groups)
    return max(0, limit - live)


def due_first(oldest_versions: list[int]) -> list[int]:
    """Positions of ready groups in the order a batch takes them: oldest token first (the
    earliest deadline: a group of oldest version o is stale from version o + max_staleness + 1),
    ties in arrival order. With unit-sized groups and one batch per step, earliest-deadline-first
    drops no group that any other order could have kept."""
    return sorted(range(len(oldest_versions)), key=oldest_versions.__getitem__)


def staleness(trainer_version: int, oldest_versions: np.ndarray | list[int]) -> np.ndarray:
    """Staleness of each rollout: trainer version minus the oldest version among its tokens."""
    return trainer_version - np.asarray(oldest_versions, dtype=np.int64)


def is_stale(trainer_version: int, oldest_version: int, max_staleness: int) -> bool:
    return trainer_version - oldest_version > max_staleness


def staleness_histogram(
    values: np.ndarray | list[int], weights: np.ndarray | list[int] | None = None
) -> dict[str, int]:
    """{staleness: count} with string keys (JSON), weighted (e.g. by tokens) when weights are given."""
    hist: Counter = Counter()
    weights = [1] * len(values) if weights is None else weights
    for v, w in zip(values, weights):
        hist[str(int(v))] += int(w)
    return dict(sorted(hist.items(), key=lambda kv: int(kv[0])))
