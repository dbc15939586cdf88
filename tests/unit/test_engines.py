"""The trainer backends are siblings behind one interface (streamrl/train/engines.make_engine picks one by
trainer.backend): both share StepEngine's training step rather than one inheriting the other's model code.

    pytest tests/unit/test_engines.py -q
"""

from __future__ import annotations

from streamrl.train.engine_interface import TrainerEngine
from streamrl.train.hf_engine import HFEngine
from streamrl.train.step_engine import StepEngine


def test_the_backends_are_siblings_behind_the_interface():
    from streamrl.train.titan_engine import TitanEngine

    for engine in (HFEngine, TitanEngine):
        assert issubclass(engine, StepEngine) and issubclass(engine, TrainerEngine)
    # the torchtitan backend builds its own model: none of the hf model code is inherited
    assert not issubclass(TitanEngine, HFEngine) and not issubclass(HFEngine, TitanEngine)
    for name in ("_build", "logprobs", "full_state_dict", "weight_stream"):
        assert name in vars(HFEngine) and name in vars(TitanEngine), name
