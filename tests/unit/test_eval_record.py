"""A round's record from its scored samples (streamrl/eval/rounds.py: round_record, counted_reward), shared
by eval rounds and `streamrl eval`, and the result's one-line summary; pure:

    pytest tests/unit/test_eval_record.py -q
"""

from __future__ import annotations

from pathlib import Path

import pytest

from streamrl.config.schema import Config, EvalConfig
from streamrl.eval.result import EvalResult, eval_dir
from streamrl.eval.rounds import EvalSample, counted_reward, round_record


def test_round_record_from_samples():
    ev = EvalConfig(samples=2, pass_k=[1])
    samples = [  # prompt 0: one correct of two; prompt 1: none (one of them a failed reward)
        EvalSample(0, 0, 1.0, "a", False, 5, 10),
        EvalSample(0, 1, 0.0, "b", False, 4, 6),
        EvalSample(1, 0, 0.0, "c", True, 5, 2),
        EvalSample(1, 1, 0.5, "c", False, 5, 2),
    ]
    rec = round_record(5, 2, samples, ev)
    assert rec["eval/step"] == 5 and rec["eval/prompts"] == 2
    assert rec["eval/pass@1"] == pytest.approx(0.25) and rec["eval/pass@2"] == pytest.approx(0.5)
    assert rec["eval/mean@2"] == pytest.approx(1.5 / 4) and rec["eval/correct_frac"] == pytest.approx(0.25)
    assert rec["eval/maj@2"] == pytest.approx(0.5)  # prompt 0: the tie goes to "a", correct; prompt 1: "c", not
    assert rec["eval/reward_errors"] == 1 and rec["eval/version_min"] == 4
    assert rec["eval/completion_len_mean"] == pytest.approx(5.0)


def test_a_failed_reward_counts_as_the_config_says():
    assert counted_reward(0.7, "", Config().reward) == 0.7
    assert counted_reward(0.7, "boom", Config().reward) == 0.0  # on_error=drop: incorrect, never left out
    scored = Config.model_validate({"reward": {"on_error": "score", "error_value": -1.0}}).reward
    assert counted_reward(0.7, "boom", scored) == -1.0


def test_result_headline_and_folder():
    metrics = {"eval/step": 3, "eval/pass@1": 0.5, "eval/pass@8": 1.0, "eval/mean@8": 0.25, "eval/maj@8": 0.75}
    res = EvalResult(Path("runs/x"), 3, metrics, eval_dir(Path("runs/x"), 3), 1.0, "checkpoints/step-00000003")
    assert res.headline() == "pass@1 0.500 | pass@8 1.000 | mean@8 0.250 | maj@8 0.750"
    assert res.samples_path == Path("runs/x/eval/step-3/samples.jsonl")
