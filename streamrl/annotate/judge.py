"""The judge's pure parts: its prompt from judge.template, and its score from the judge's text.

    text = render(cfg.judge.template, rollout.prompt_text, rollout.text, rollout.meta)   # or raises JudgeError
    value = parse_score(cfg.judge.score, judge_output)                                   # or raises JudgeError

A JudgeError is one rollout's annotation error (its message is the annotation's `error` and the
dead-letter reason), never the worker's crash. No I/O here, so unit tests need no engine.
"""

from __future__ import annotations

import json
import math
import re

from streamrl.config.schema import JudgeScore

REFERENCE_FIELD = "answer"
"""meta key of a task's reference answer (gsm8k, math datasets: streamrl/feed/sources.py)."""
_SHOWN = 120
"""Characters of a judge output quoted in an error (enough to see why it did not parse)."""


class JudgeError(ValueError):
    """This rollout cannot be judged (prompt not rendered, output not parsed); the message says why."""


def render(template: str, prompt: str, completion: str, meta: dict) -> str:
    """The judge's prompt: {prompt}, {completion} and {reference} replaced in one pass, so a brace in
    the completion (or in the template's own JSON example) is never read as a placeholder."""
    values = {"{prompt}": prompt, "{completion}": completion}
    if "{reference}" in template:
        if REFERENCE_FIELD not in meta:
            raise JudgeError(
                "judge.template names {reference}, but this rollout's task has no reference answer "
                f"(meta[{REFERENCE_FIELD!r}]); remove {{reference}} or use a task with answers"
            )
        values["{reference}"] = str(meta[REFERENCE_FIELD])
    return re.sub(r"\{(?:prompt|completion|reference)\}", lambda m: values[m.group(0)], template)


def _number(raw, where: str, output: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise JudgeError(f"{where} is {raw!r}, not a number; judge output: {output[:_SHOWN]!r}")
    try:
        value = float(raw)
    except ValueError:
        raise JudgeError(f"{where} is {raw!r}, not a number; judge output: {output[:_SHOWN]!r}") from None
    if not math.isfinite(value):
        raise JudgeError(f"{where} is {value}; judge output: {output[:_SHOWN]!r}")
    return value


def _last_json_object(output: str) -> dict | None:
    """The last top-level `{...}` in `output` that parses as a JSON object (a judge often writes prose
    first); objects nested in it are its fields, not candidates."""
    decoder = json.JSONDecoder()
    found, start = None, output.find("{")
    while start != -1:
        try:
            obj, end = decoder.raw_decode(output, start)
        except ValueError:
            end = start + 1
        else:
            if isinstance(obj, dict):
                found = obj
        start = output.find("{", end)
    return found


def parse_score(spec: JudgeScore, output: str) -> float:
    """The number judge.score reads from `output`; JudgeError when there is none."""
    if spec.regex is not None:
        match = re.search(spec.regex, output)
        if match is None:
            raise JudgeError(f"judge output does not match judge.score.regex={spec.regex!r}: {output[:_SHOWN]!r}")
        group = "score" if "score" in match.re.groupindex else 1
        return _number(match.group(group), f"judge.score.regex group {group!r}", output)
    obj = _last_json_object(output)
    if obj is None:
        raise JudgeError(f"judge output has no JSON object for judge.score.json_field: {output[:_SHOWN]!r}")
    value = obj
    for part in spec.json_field.split("."):
        if not isinstance(value, dict) or part not in value:
            raise JudgeError(f"judge output's JSON has no field {spec.json_field!r}: {output[:_SHOWN]!r}")
        value = value[part]
    return _number(value, f"judge.score.json_field {spec.json_field!r}", output)
