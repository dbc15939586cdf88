"""Eval metrics and scheduling (streamrl/eval/rounds.py), pure: pytest tests/unit/test_eval.py -q"""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest
from pydantic import ValidationError

from streamrl.config.schema import Config, EvalConfig
from streamrl.core.messages import eval_group_id, eval_group_of, is_eval_group, parse_eval_group
from streamrl.eval.rounds import (
    answer_key,
    due_version,
    majority_correct,
    pass_at_k,
    round_metrics,
)


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """Fraction of all k-subsets of n samples (the first c correct) holding at least one correct one."""
    subsets = list(combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_matches_brute_force(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_edges():
    assert pass_at_k(10, 0, 5) == 0.0 and pass_at_k(10, 6, 5) == 1.0 and pass_at_k(10, 3, 1) == pytest.approx(0.3)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_majority_vote():
    assert majority_correct(["4", "4", "5"], [True, True, False])
    assert not majority_correct(["5", "4", "5"], [False, True, False])
    assert majority_correct(["4", "5"], [True, False])  # tie: the answer seen first
    assert not majority_correct(["5", "4"], [False, True])


def test_round_metrics():
    rewards = np.array([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.5], [1.0, 1.0, 1.0, 1.0]])
    answers = [["a", "b", "a", "c"], ["x", "x", "y", "z"], ["k", "k", "k", "k"]]
    m = round_metrics(rewards, answers, threshold=1.0, ks=[1, 2, 4])
    assert m["eval/pass@1"] == pytest.approx((0.5 + 0 + 1) / 3)
    assert m["eval/pass@2"] == pytest.approx((pass_at_k(4, 2, 2) + 0 + 1) / 3)
    assert m["eval/pass@4"] == pytest.approx(2 / 3)
    assert m["eval/mean@4"] == pytest.approx(rewards.mean())
    assert m["eval/maj@4"] == pytest.approx(2 / 3)  # prompt 0 votes "a" (correct), 1 votes "x" (wrong), 2 "k"
    assert m["eval/correct_frac"] == pytest.approx(6 / 12) and m["eval/prompts"] == 3
    assert round_metrics(rewards, answers, threshold=0.5, ks=[1])["eval/pass@1"] == pytest.approx((0.5 + 0.25 + 1) / 3)


def test_due_versions():
    def issued(every, at_start, steps, seen, at_end=False):
        last, out = -1, []
        for v in seen:
            if due_version(v, last, every, at_start, steps, at_end):
                out.append(v)
                last = v
        return out

    assert issued(10, True, 30, range(31)) == [0, 10, 20]
    assert issued(10, False, 30, range(31)) == [10, 20]
    assert issued(10, True, 30, [0, 0, 3, 12, 13, 25, 31]) == [0, 12, 25]  # a feeder that saw only some versions
    assert issued(5, True, 12, [2, 4, 6]) == [2, 6]
    assert issued(10, True, 30, range(32), at_end=True) == [0, 10, 20, 30]
    assert issued(10, False, 25, range(26), at_end=True) == [10, 20, 25]


def test_ids_and_answer_keys():
    gid = eval_group_id(10, 16, 3)
    assert parse_eval_group(gid) == (10, 16, 3) and is_eval_group(gid)
    assert eval_group_of(f"{gid}:5") == gid and eval_group_of("g12:5") is None and parse_eval_group("g12") is None
    assert answer_key("0123456789abcdefXYZ", {"length": 16, "chars": "0123456789"}) == "0123456789abcdef"
    assert answer_key("<think>2+2</think>  the answer:\n 4 ", {"answer": "4"}) == "the answer: 4"
    assert answer_key("work\n#### 42", {"answer": "42"}) == "42"


def test_eval_config():
    assert Config().eval.every_steps is None
    cfg = Config.model_validate(
        {"eval": {"every_steps": 10, "samples": 4, "pass_k": [1, 2], "task": {"name": "charclass", "num_prompts": 8}}}
    )
    assert cfg.eval.task.num_prompts == 8
    with pytest.raises(ValidationError, match=r"eval.pass_k=\[8\] needs every k in \[1, eval.samples=4\]"):
        EvalConfig(samples=4, pass_k=[8])
    with pytest.raises(ValidationError):
        EvalConfig(every_steps=0)
