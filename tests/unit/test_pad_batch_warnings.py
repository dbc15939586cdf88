"""A batch of rollouts decoded from the wire (read-only arrays) pads into tensors without NumPy's
"not writable" UserWarning that every run's trainer log used to show (pure).

    pytest tests/unit/test_pad_batch_warnings.py -q
"""

from __future__ import annotations

import warnings

import numpy as np

from streamrl.core.batch import Batch
from streamrl.core.messages import Rollout, decode, encode
from streamrl.train.batching import pad_batch


def test_decoded_rollouts_pad_without_a_warning():
    sent = Rollout(
        rollout_id="g:0:t0",
        group_id="g",
        sample=0,
        group_size=1,
        prompt_ids=np.array([1, 2]),
        completion_ids=np.array([3, 4]),
        logprobs=np.array([-0.5, -1.5]),
        version=0,
    )
    got = decode(encode(sent))
    assert not got.logprobs.flags.writeable  # what the trainer gets from the broker
    batch = Batch(
        rollouts=[got],
        group_index=np.array([0]),
        rewards=np.array([1.0], np.float32),
        advantages=np.array([1.0], np.float32),
        ref_logprobs=[np.frombuffer(np.array([-1.0, -1.0], np.float32).tobytes(), np.float32)],
        staleness=np.array([0]),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = pad_batch(batch, pad_id=0)
    assert out["old_logprobs"][0].tolist() == [-0.5, -1.5] and out["ref_logprobs"][0].tolist() == [-1.0, -1.0]
