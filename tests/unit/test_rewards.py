"""Reward functions and their resolution: pytest tests/unit/test_rewards.py"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from streamrl.annotate.rewards import (
    BUILTIN_REWARDS,
    extract_final_number,
    math_reward,
    resolve_reward,
)
from streamrl.config.schema import RewardConfig
from streamrl.core.errors import ConfigError
from streamrl.tasks.charclass import CHAR_CLASSES, charclass_reward
from streamrl.tasks.math_answers import math_verify_reward

DIGITS = {"task": "charclass", "cls": "digits", "chars": CHAR_CLASSES["digits"], "length": 16}
UPPER = {"task": "charclass", "cls": "upper", "chars": CHAR_CLASSES["upper"], "length": 16}


@pytest.mark.parametrize(
    "completion, meta, want",
    [
        ("0123456789012345", DIGITS, 1.0),
        ("01234567890123456789", DIGITS, 1.0),  # only the first `length` characters count
        ("abcdefghabcdefgh", DIGITS, 0.0),
        ("0123abcd0123abcd", DIGITS, 0.5),
        ("01234567", DIGITS, 0.5),  # stopping early scores low
        ("", DIGITS, 0.0),
        ("ABCDEFGHIJKLMNOP", UPPER, 1.0),
        ("ABCDEFGHIJKLMNOP", DIGITS, 0.0),  # the prompt's class decides
        ("AbCdEfGhIjKlMnOp", UPPER, 0.5),
    ],
)
def test_charclass_reward(completion: str, meta: dict, want: float):
    assert charclass_reward(f"{meta['cls']}:", completion, meta) == pytest.approx(want)


@pytest.mark.parametrize(
    "completion, want",
    [
        ("She has 3 apples, then 5 more.\n#### 8", 8.0),
        ("#### 1,250 dollars", 1250.0),
        ("#### $-3.5", -3.5),
        ("first #### 4 then #### 9", 9.0),
        ("so the answer is \\boxed{12}", 12.0),
        ("\\boxed{1,000} and 7 later", 1000.0),
        ("2 + 3 = 5, so 5.", 5.0),
        ("it is -0.75", -0.75),
        ("no numbers here", None),
        ("", None),
    ],
)
def test_extract_final_number(completion: str, want: float | None):
    assert extract_final_number(completion) == want


def test_math_reward():
    meta = {"task": "gsm8k", "answer": "42"}
    assert math_reward("q", "6*7=42\n#### 42", meta) == 1.0
    assert math_reward("q", "#### 42.0000000001", meta) == 1.0
    assert math_reward("q", "#### 41", meta) == 0.0
    assert math_reward("q", "I don't know", meta) == 0.0
    assert math_reward("q", "\\boxed{1,250}", {"answer": 1250}) == 1.0
    assert math_reward("q", "#### 42", {"answer": "n/a"}) == 0.0


def test_resolve_builtins_and_module_paths():
    assert resolve_reward("charclass") is charclass_reward
    assert resolve_reward("math") is math_verify_reward
    assert resolve_reward("math_regex") is math_reward
    assert resolve_reward("streamrl.annotate.rewards:math_reward") is math_reward


@pytest.mark.parametrize(
    "spec, match",
    [
        (
            "nonsense",
            r"not a built-in reward \(charclass, env, math, math_lenient, math_regex, reasoning_gym, think_format\); use one of those or `package.module:function`",
        ),
        ("no_such_module_xyz:fn", r"cannot import module 'no_such_module_xyz'.*PYTHONPATH"),
        ("streamrl.annotate.rewards:nope", r"has no function 'nope'; define `def NAME"),
        ("streamrl.annotate.rewards:BUILTIN_REWARDS", r"has no function 'BUILTIN_REWARDS'"),
    ],
)
def test_resolve_errors_name_the_fix(spec: str, match: str):
    with pytest.raises(ConfigError, match=match):
        resolve_reward(spec)


def test_config_validator_accepts_exactly_the_builtins_and_module_syntax():
    for name in BUILTIN_REWARDS:
        assert RewardConfig(fn=name).fn == name
    assert RewardConfig(fn="my_pkg.scores:exact_match").fn == "my_pkg.scores:exact_match"
    # Syntax only: an uninstalled module is accepted at config time (the reward worker imports it).
    assert RewardConfig(fn="not_installed_pkg:f").fn == "not_installed_pkg:f"
    for bad in ["mathh", "pkg.mod", "pkg:mod:fn", "pkg..mod:fn", ":fn", "pkg:"]:
        with pytest.raises(ValidationError, match="reward.fn=math or reward.fn=my_rewards:score"):
            RewardConfig(fn=bad)


def test_env_reward_reads_the_episode_reward_and_names_the_fix_without_one():
    fn = resolve_reward("env")
    assert fn("?", "abc", {"env_reward": 0.75}) == 0.75
    with pytest.raises(ValueError, match="multi-turn episodes only"):
        fn("?", "abc", {})
