"""Fixtures the trainer tests share: the offline tiny model, its HF forward, and an on-policy batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from streamrl.config.schema import TinyModelConfig
from streamrl.core.batch import Batch
from streamrl.models.tiny import build_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_model(TinyModelConfig(), tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="module")
def hf_model(tiny):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def batch(hf_model) -> Batch:
    """test_train_engine's batch; behaviour log-probs = the initial policy's, so the first step is exactly
    on-policy (ratio 1)."""
    from tests.integration.train.test_train_engine import make_batch, reference_logprobs

    b = make_batch(hf_model.config.vocab_size)
    for r, lp in zip(b.rollouts, reference_logprobs(hf_model, b)):
        r.logprobs = lp.astype(np.float32)
    return b
