"""math-verify answers, the <think> format reward and combined rewards: pytest tests/unit/test_rewards_math.py"""

from __future__ import annotations

import threading

import pytest
from pydantic import ValidationError

from streamrl.annotate.rewards import BUILTIN_REWARDS, Scored, make_reward
from streamrl.config.schema import REWARD_BUILTINS, RewardConfig
from streamrl.core.messages import Annotation, decode, encode
from streamrl.tasks.math_answers import math_lenient_reward, math_verify_reward, think_format_reward


@pytest.mark.parametrize(
    "completion, answer, want",
    [
        ("6*7=42\n#### 42", "42", 1.0),
        ("#### 1,250 dollars", "1250", 1.0),
        ("6*7=42\n#### 42\n#### 42.", "42", 1.0),  # the same answer twice
        ("so the answer is \\boxed{12}", "12", 1.0),
        ("#### $\\frac{1}{2}$", "0.5", 1.0),  # symbolic: the regex reward scores this 0
        ("#### 3/4", "0.75", 1.0),
        ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", 1.0),
        ("<think>7 is not it; 6*7 = 42</think> \\boxed{42}", "42", 1.0),  # the reasoning's numbers are ignored
        ("<think>the answer is 42</think> \\boxed{41}", "42", 0.0),
        ("#### 41", "42", 0.0),
        ("I don't know", "42", 0.0),
        ("#### 42", "n/a", 0.0),
        ("", "42", 0.0),
    ],
)
def test_math_verify_reward(completion: str, answer: str, want: float):
    assert math_verify_reward("q", completion, {"answer": answer}) == want


@pytest.mark.parametrize(
    "completion",
    [
        "2+CU&I*G<!'d7G-w",  # an answer-like string with no stated answer (math-verify alone finds the 2)
        "The answer is 2.",  # no `####` line and no box: the task's format was asked for
        "#### 2+CU&I*G<!'d7G-w",  # trailing garbage on the answer line
        "#### 2 or 3",  # two numbers on one answer line
        "#### 3\n#### 2",  # several different answers: the last one right is still a hedge
        "\\boxed{2} \\boxed{5}",
        "#### 2 \\boxed{7}",  # a box on the answer line is the answer, and it is wrong
        "<think>so #### 2</think> #### 9",  # the reasoning's answer is not the final one
    ],
)
def test_strict_math_scores_the_hacks_policies_find_zero(completion: str):
    assert math_verify_reward("What is 1+1?", completion, {"answer": "2"}) == 0.0


def test_an_echo_of_the_prompts_worked_example_is_not_the_answer():
    prompt = "Example: 3+4 = ?\n#### 7\nQuestion: 5+2 = ?"
    assert math_verify_reward(prompt, prompt + "\nI am not sure.", {"answer": "7"}) == 0.0
    assert math_verify_reward(prompt, prompt + "\n5+2=7\n#### 7", {"answer": "7"}) == 1.0


def test_lenient_math_reads_free_text_as_math_verify_does():
    assert math_lenient_reward("q", "The answer is $\\frac{1}{2}$", {"answer": "0.5"}) == 1.0
    assert math_lenient_reward("q", "first #### 4 then #### 9", {"answer": "9"}) == 1.0
    assert math_lenient_reward("q", "2+CU&I*G<!'d7G-w", {"answer": "2"}) == 1.0  # why it is not the default


def test_math_verify_runs_on_the_reward_workers_scoring_thread():
    # math-verify's default SIGALRM guard raises off the main thread; the reward must not rely on it.
    out = []
    t = threading.Thread(target=lambda: out.append(math_verify_reward("q", "\\boxed{3/4}", {"answer": "0.75"})))
    t.start()
    t.join(60)
    assert out == [1.0]


@pytest.mark.parametrize(
    "completion, want",
    [
        ("<think>6*7 is 42</think> 42", 1.0),
        ("  <think>\nreason\n</think>\n\\boxed{1}", 1.0),
        ("<think></think> 42", 0.5),  # empty reasoning
        ("<think>reason</think>", 0.5),  # no answer after the block
        ("hi <think>reason</think> 42", 0.5),  # text before the block
        ("<think>a</think><think>b</think> 42", 0.5),
        ("<think>never closed 42", 0.0),
        ("</think> reason <think> 42", 0.0),  # tags in the wrong order
        ("42", 0.0),
    ],
)
def test_think_format_reward(completion: str, want: float):
    assert think_format_reward("q", completion, {}) == want


def test_builtin_names_agree_with_the_config():
    assert sorted(BUILTIN_REWARDS) == sorted(REWARD_BUILTINS)


def test_components_sum_with_weights_and_keep_each_part():
    cfg = RewardConfig(
        components=[
            {"fn": "math", "weight": 1.0},
            {"fn": "think_format", "weight": 0.2},
            {"fn": "streamrl.tasks.math_answers:think_format_reward", "name": "fmt2", "weight": -1},
        ]
    )
    fn = make_reward(cfg)
    out = fn("q", "<think>6*7</think> \\boxed{42}", {"answer": "42"})
    assert isinstance(out, Scored) and out == pytest.approx(1.0 + 0.2 - 1.0)
    assert out.parts == {"math": 1.0, "think_format": 1.0, "fmt2": 1.0}
    assert make_reward(RewardConfig(fn="math")) is math_verify_reward  # no components: reward.fn alone
    with pytest.raises(ValidationError, match="names .* repeat"):
        RewardConfig(components=[{"fn": "math"}, {"fn": "think_format", "name": "math"}])
    with pytest.raises(ValidationError, match="reward.components\\[\\].fn='mathh'"):
        RewardConfig(components=[{"fn": "mathh"}])


def test_annotation_parts_travel_and_are_validated():
    a = Annotation(rollout_id="g0:0", key="reward", value=1.2, parts={"math": 1.0, "think_format": 1.0})
    assert decode(encode(a)).parts == {"math": 1.0, "think_format": 1.0}
    assert decode(encode(Annotation(rollout_id="g0:0", key="reward", value=1.0))).parts == {}
    from streamrl.core.errors import DecodeError

    with pytest.raises(DecodeError, match="parts must map names to finite numbers"):
        decode(encode(Annotation(rollout_id="g0:0", key="reward", value=1.0, parts={"math": float("nan")})))


def test_the_deliberately_disabled_timeout_is_not_warned(caplog, monkeypatch):
    import math_verify.grader
    import math_verify.parser

    for module in (math_verify.parser, math_verify.grader):  # it warns once per process
        monkeypatch.setattr(module, "TIMEOUT_WARNING_SHOWN", False)
    with caplog.at_level("WARNING"):
        assert math_verify_reward("q", "\\boxed{42}", {"answer": "42"}) == 1.0
    assert not [r for r in caplog.records if "Timeout is disabled" in r.getMessage()]
