"""Built-in rewards for reasoning tasks: math answers checked with Hugging Face's `math-verify`, and
a format reward for `<think>...</think>` reasoning.

    reward.fn=math            # math_verify_reward: the final answer, stated as `#### N` or `\\boxed{N}`,
                              # equals meta["answer"] (strict: anything else scores 0)
    reward.fn=math_lenient    # math_lenient_reward: math-verify's own extraction from the answer text
    reward.fn=think_format    # think_format_reward: 1.0 for "<think>reasoning</think>answer"

Why strict by default: math-verify, given free text, takes the first answer-like thing it finds, so
`2+CU&I*G<!'d7G-w` scored 1.0 for the answer 2, and an RL policy finds such strings. The strict reward
reads only answers stated in the two formats tasks ask for (GSM8K's `#### N` line, `\\boxed{}`), after
the reasoning (`</think>`), and scores 0 for: no stated answer, a `####` line with anything but the
answer on it (trailing garbage), several different stated answers (hedging), and answers that are only
a copy of the prompt (an echoed few-shot example).

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


_HASH_LINE = re.compile(r"####([^\n]*)")
_BOXED = re.compile(r"\\boxed\s*\{")
_PLAIN_ANSWER = re.compile(
    r"\$?\s*[-+]?(\d[\d,]*(\.\d+)?|\.\d+)(\s*/\s*\d+)?\s*%?"  # 42, -1,250.5, 3/4, 12%, $5
    r"(\s+[A-Za-z]+){0,2}"  # up to two unit words: "#### 1,250 dollars"
)
_LATEX_ANSWER = re.compile(r"\$[^$]+\$|\\[A-Za-z]+\s*\{.*\}")  # $x^2$, \frac{1}{2}, \sqrt{2}


def _boxed(text: str) -> list[str]:
    """The contents of every `\\boxed{...}` in text (braces balanced); an unclosed one is skipped."""
    found = []
    for m in _BOXED.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            found.append(text[m.end() : i - 1].strip())
    return found


def stated_answers(prompt: str, completion: str) -> list[str] | None:
    """The answers a completion states in a task's formats (`#### N` lines, `\\boxed{N}`), after its
    reasoning; None when a `####` line holds more than one answer-like thing (trailing garbage). Text
    that copies the prompt verbatim (an echo of a few-shot example) is not read."""
    text = completion.rsplit(THINK_CLOSE, 1)[-1]
    if len(prompt.strip()) >= 16:
        text = text.replace(prompt.strip(), " ")
    answers = []
    for m in _HASH_LINE.finditer(text):
        line = m.group(1).strip().rstrip(".").strip()
        boxed = _boxed(line)
        if boxed:
            continue  # "#### \\boxed{4}": read as the box below
        if not (_PLAIN_ANSWER.fullmatch(line) or _LATEX_ANSWER.fullmatch(line)):
            return None
        answers.append(line)
    return answers + _boxed(text)


def _gold(meta: dict) -> list:
    gold_text = str(meta["answer"]).strip()
    return _parse(gold_text if gold_text.startswith("$") or "\\" in gold_text else f"${gold_text}$")


def _as_math(answer: str) -> list:
    """math-verify's parse of one stated answer: a plain number (commas and unit words dropped) or LaTeX."""
    if m := _PLAIN_ANSWER.fullmatch(answer):
        number = m.group(0)
        for unit in (m.group(4) or "").split():
            number = number.replace(unit, "")
        return _parse("$" + number.replace("$", "").replace(",", "").strip() + "$")
    return _parse(answer if answer.startswith("$") else f"${answer}$")


def math_verify_reward(prompt: str, completion: str, meta: dict) -> float:
    """1.0 if the completion states exactly one final answer (`#### N` or `\\boxed{N}`; every stated
    answer agreeing) and it equals meta["answer"] by math-verify's comparison, else 0.0."""
    from math_verify import verify

    answers = stated_answers(prompt, completion)
    gold = _gold(meta)
    if not answers or not gold:
        return 0.0
    parsed = [_as_math(a) for a in answers]
    if any(not p for p in parsed):
        return 0.0
    last = parsed[-1]
    if any(not verify(last, p, timeout_seconds=None) for p in parsed[:-1]):
        return 0.0  # several different answers: a hedge, not an answer
    return 1.0 if verify(gold, last, timeout_seconds=None) else 0.0


def math_lenient_reward(prompt: str, completion: str, meta: dict) -> float:
    """math-verify's own extraction from the completion's answer text (after `</think>` and the last
    `####`): 1.0 if it equals meta["answer"]. It accepts an answer buried in other text, which an RL
    policy can exploit (see the module docstring): use it for evaluation of free-form answers."""
    from math_verify import verify

    gold = _gold(meta)
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
