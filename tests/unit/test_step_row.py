"""streamrl.train.metrics.step_row: the metrics.jsonl row the trainer and bench/sim_workers.py's trainer share.

pytest tests/unit/test_step_row.py -q
"""

from __future__ import annotations

import numpy as np

from streamrl.core.batch import Batch
from streamrl.core.messages import Rollout
from streamrl.train.metrics import step_row


def _rollout(gid: str, sample: int, completion: int) -> Rollout:
    return Rollout(
        rollout_id=f"{gid}:{sample}:t0",
        group_id=gid,
        sample=sample,
        group_size=2,
        prompt_ids=np.array([1, 2]),
        completion_ids=np.arange(completion),
        logprobs=np.zeros(completion),
        version=1,
        text="x" * completion,
        prompt_text="ab",
    )


def _batch() -> Batch:
    return Batch(
        rollouts=[_rollout("g0", 0, 2), _rollout("g0", 1, 4), _rollout("g1", 0, 3), _rollout("g1", 1, 3)],
        group_index=np.array([0, 0, 1, 1]),
        rewards=np.array([1.0, 0.0, 0.5, 0.5], np.float32),
        advantages=np.zeros(4, np.float32),
        ref_logprobs=None,
        staleness=np.array([0, 0, 2, 2]),
        reward_components={"reward/math": np.array([1.0, 0.0, 0.0, 1.0])},
        stats={"wait_s": 0.123456, "dropped_stale": 1.0},
    )


def test_the_row_says_what_the_batch_and_the_step_timing_say():
    row = step_row(_batch(), 3, time_s=12.34567, train_s=0.987654, stall_s=0.011111, overlap=3)
    assert (row["step"], row["policy_version"], row["samples"], row["tokens"]) == (3, 3, 4, 12)
    assert row["reward_mean"] == 0.5 and abs(row["reward_std"] - 0.353553) < 1e-6
    assert (row["staleness_max"], row["staleness_mean"]) == (2, 1.0)
    assert row["staleness_hist"] == {"0": 2, "2": 2}
    assert row["staleness_hist_tokens"] == {"0": 6, "2": 6}  # tokens, not rollouts
    assert (row["time_s"], row["wait_s"], row["train_s"], row["publish_stall_s"]) == (12.346, 0.1235, 0.9877, 0.0111)
    assert (row["overlap_rollouts"], row["overlap_frac"]) == (3, 0.75)
    assert row["completion_len_mean"] == 3.0
    assert row["zero_variance_frac"] == 0.5  # g1's rewards are equal: no learning signal from it
    assert row["reward_components"] == {"reward/math": 0.5}
    assert row["dropped_stale"] == 1.0 and list(row).count("wait_s") == 1  # the assembler's counters, wait_s once


def test_what_the_caller_did_not_measure_is_left_out():
    # bench/sim_workers.py's trainer publishes no weights and does not track overlap: no made-up zeros
    row = step_row(_batch(), 1, time_s=1.0, train_s=0.5)
    assert not {"publish_stall_s", "overlap_rollouts", "overlap_frac"} & set(row)
    assert row["train_s"] == 0.5 and row["tokens"] == 12
