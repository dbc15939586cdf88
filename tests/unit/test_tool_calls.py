"""Tool-call parsing: Hermes/Qwen tags and OpenAI-style JSON; invalid calls come back with an error."""

from __future__ import annotations

from streamrl.envs.tool_calls import parse_tool_calls


def test_hermes_tags_several_calls_with_text_around():
    text = (
        'Let me compute.\n<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call>\n'
        '<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call> done'
    )
    calls = parse_tool_calls(text)
    assert [(c.name, c.arguments, c.error) for c in calls] == [
        ("python", {"code": "print(1)"}, ""),
        ("search", {"q": "x"}, ""),
    ]


def test_openai_style_shapes():
    plain = parse_tool_calls('{"name": "python", "arguments": "{\\"code\\": \\"1+1\\"}"}')
    wrapped = parse_tool_calls(
        '```json\n{"type": "function", "function": {"name": "python", "arguments": {"code": "2"}}}\n```'
    )
    listed = parse_tool_calls('{"tool_calls": [{"function": {"name": "a", "arguments": {}}}, {"name": "b"}]}')
    assert [(c.name, c.arguments) for c in plain] == [("python", {"code": "1+1"})]
    assert [(c.name, c.arguments) for c in wrapped] == [("python", {"code": "2"})]
    assert [(c.name, c.arguments, c.error) for c in listed] == [("a", {}, ""), ("b", {}, "")]


def test_no_call_is_a_final_answer():
    assert parse_tool_calls("The answer is 42. #### 42") == []
    assert parse_tool_calls('{"answer": 42}') == []


def test_invalid_calls_carry_their_reason():
    bad_json = parse_tool_calls('<tool_call>{"name": "python", "arguments": {code: 1}}</tool_call>')
    unclosed = parse_tool_calls('<tool_call>{"name": "python", "argum')
    no_name = parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>')
    bad_args = parse_tool_calls('<tool_call>{"name": "python", "arguments": [1, 2]}</tool_call>')
    bad_arg_string = parse_tool_calls('{"name": "python", "arguments": "{oops"}')
    top_json = parse_tool_calls('{"name": "python", "arguments": {')
    assert "not valid JSON" in bad_json[0].error
    assert "never closed" in unclosed[0].error
    assert 'needs a string "name"' in no_name[0].error
    assert bad_args[0].name == "python" and "must be a JSON object" in bad_args[0].error
    assert "not valid JSON" in bad_arg_string[0].error
    assert "not valid JSON" in top_json[0].error
