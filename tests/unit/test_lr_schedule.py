"""The trainer's learning-rate schedule (pure)."""

import math

import pytest

from streamrl.config.schema import TrainerConfig
from streamrl.train.step_engine import lr_factor


def factors(**kw):
    tc = TrainerConfig(steps=11, **kw)
    return [lr_factor(tc, s) for s in range(11)]


def test_constant():
    assert factors() == [1.0] * 11


def test_linear_reaches_min_ratio_at_last_step():
    f = factors(lr_schedule="linear", min_lr_ratio=0.1)
    assert f[0] == 1.0 and f[-1] == pytest.approx(0.1) and f[5] == pytest.approx(0.55)
    assert all(a >= b for a, b in zip(f, f[1:]))


def test_cosine_shape():
    f = factors(lr_schedule="cosine", min_lr_ratio=0.0)
    assert f[0] == 1.0 and f[-1] == pytest.approx(0.0, abs=1e-12)
    assert f[5] == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))


def test_warmup_then_schedule():
    f = factors(lr_schedule="linear", warmup_steps=3, min_lr_ratio=0.0)
    assert f[:3] == pytest.approx([0.25, 0.5, 0.75])
    assert f[3] == 1.0 and f[-1] == pytest.approx(0.0)
