"""Parse the tool calls in a model turn: Hermes/Qwen tags and OpenAI-style JSON (pure, no I/O).

    calls = parse_tool_calls(turn_text)      # [ToolCall(name, arguments, error), ...]; [] = no call

Formats:
- Hermes/Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number per turn, text
  around them allowed. An opened tag never closed (the turn hit max_tokens) is an invalid call.
- OpenAI-style JSON, when the whole turn (optionally in a ```json fence) is JSON: `{"name", "arguments"}`,
  `{"type": "function", "function": {"name", "arguments"}}`, `{"tool_calls": [...]}` or a list of
  these; `arguments` may be an object or a JSON string of one (as the OpenAI API sends it).
A call that cannot be used (bad JSON, no name, arguments not an object) comes back with `error` set,
so the env answers it with an error observation instead of ending the episode.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_TAGGED = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


@dataclass
class ToolCall:
    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    """Why this call is invalid (empty: a well-formed call; the tool may still reject its arguments)."""


def _from_object(obj: Any) -> ToolCall:
    if not isinstance(obj, dict):
        return ToolCall(error=f"a tool call must be a JSON object with name and arguments, got {json.dumps(obj)[:80]}")
    fn = obj.get("function") if isinstance(obj.get("function"), dict) else obj
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall(error=f'a tool call needs a string "name", got {json.dumps(obj)[:80]}')
    args = fn.get("arguments", fn.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            return ToolCall(name=name, error=f"arguments of {name!r} are a string that is not valid JSON ({exc.msg})")
    if not isinstance(args, dict):
        return ToolCall(name=name, error=f"arguments of {name!r} must be a JSON object, got {json.dumps(args)[:80]}")
    return ToolCall(name=name, arguments=args)


def _from_json(value: Any) -> list[ToolCall]:
    if isinstance(value, dict) and isinstance(value.get("tool_calls"), list):
        value = value["tool_calls"]
    items = value if isinstance(value, list) else [value]
    return [_from_object(v) for v in items]


def _looks_like_call(text: str) -> bool:
    return text.startswith(("{", "[")) and ('"name"' in text or '"function"' in text or '"tool_calls"' in text)


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every tool call in `text`, in order; [] when it holds none (a final answer)."""
    if "<tool_call>" in text:
        calls = []
        for body, close in _TAGGED.findall(text):
            if not close:
                calls.append(ToolCall(error="<tool_call> was opened but never closed with </tool_call>"))
                continue
            try:
                calls.extend(_from_json(json.loads(body.strip())))
            except json.JSONDecodeError as exc:
                calls.append(ToolCall(error=f"the <tool_call> body is not valid JSON ({exc.msg} at char {exc.pos})"))
        return calls
    stripped = text.strip()
    if m := _FENCE.match(stripped):
        stripped = m.group(1)
    if not _looks_like_call(stripped):
        return []
    try:
        return _from_json(json.loads(stripped))
    except json.JSONDecodeError as exc:
        return [ToolCall(error=f"the tool call is not valid JSON ({exc.msg} at char {exc.pos})")]
