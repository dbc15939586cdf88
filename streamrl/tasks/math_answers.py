"""Built-in rewards for reasoning tasks: math answers checked with Hugging Face's `math-verify`, and
a format reward for `<think>...</think>` reasoning.

    reward.fn=math            # math_verify_reward: 1.0 if the completion's answer equals meta["answer"]
    reward.fn=think_format    # think_format_reward: 1.0 for "<think>reasoning</think>answer"

math-verify parses LaTeX (\\boxed{}, \\frac, $...$) and plain expressions with sympy and compares
them symbolically, so `\\frac{1}{2}`, `0.5` and `1/2` agree. It guards its calls with SIGALRM,
which works only on the main thread; the reward worker calls rewards on a scoring thread, so
that guard is off here and `reward.timeout_s` bounds a slow parse instead (the worker abandons
the call and fails only that rollout).
"""

from __future__ import annotations

import logging
import re

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_THINK = re.compile(r"^\s*<think>(.*?)</think>(.*)$", re.DOTALL)


def answer_part(completion: str) -> str:
    """What the completion answers, without its reasoning: the text after the last </think>, and
    after the last GSM8K-style '####' if there is one."""
    text = completion.rsplit(THINK_CLOSE, 1)[-1]
    return text.rsplit("####", 1)[-1] if "####" in text else text


class _TimeoutOffNote(logging.Filter):
    """Drops math-verify's "Timeout is disabled" warning, logged when a call turns its timeout off:
    here that is deliberate (reward.timeout_s bounds the call, see above)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_TimeoutOffNote())


def _parse(text: str) -> list:
    from math_verify import parse

    return parse(text, parsing_timeout=None)


def math_verify_reward(prompt: str, completion: str, meta: dict) -> float:
    """1.0 if the completion's final answer equals meta["answer"] by math-verify's comparison, else 0.0."""
    from math_verify import verify

    gold_text = str(meta["answer"]).strip()
    gold = _parse(gold_text if gold_text.startswith("$") or "\\" in gold_text else f"${gold_text}$")
    pred = _parse(answer_part(completion))
    if not gold or not pred:
        return 0.0
    return 1.0 if verify(gold, pred, timeout_seconds=None) else 0.0


def think_format_reward(prompt: str, completion: str, meta: dict) -> float:
    """Reasoning format, in the spirit of torchforge's ThinkingReward: 1.0 for exactly one
    `<think>...</think>` block at the start, with non-empty reasoning, followed by a non-empty answer;
    0.5 (partial credit) when both tags are there but the structure is off (empty parts, text before
    the block, repeated tags); 0.0 without a closed block."""
    opens, closes = completion.count(THINK_OPEN), completion.count(THINK_CLOSE)
    if opens == 0 or closes == 0 or completion.find(THINK_OPEN) > completion.rfind(THINK_CLOSE):
        return 0.0
    m = _THINK.match(completion)
    if opens == 1 and closes == 1 and m and m.group(1).strip() and m.group(2).strip():
        return 1.0
    return 0.5
