"""Tool registry and dispatch, and the ToolEnv: user tools from `pkg.mod:fn`, invalid calls (unknown
name, bad JSON, bad arguments, a raising tool) answered with error observations, counted."""

from __future__ import annotations

import pytest

from streamrl.config.schema import Config
from streamrl.core.errors import ConfigError
from streamrl.envs.base import check_step
from streamrl.envs.resolve import env_factory, resolve_env
from streamrl.envs.tool_calls import ToolCall
from streamrl.envs.tool_env import ToolEnv
from streamrl.envs.tools import clip, dispatch, load_tools


def add(a: int, b: float = 1.0) -> float:
    """Add two numbers.

    Longer text that is not part of the description."""
    return a + b


def boom(text: str) -> str:
    """Always fails."""
    raise RuntimeError("disk on fire")


SPECS = ["tests.unit.test_tools:add", "tests.unit.test_tools:boom"]


def test_schema_from_signature_and_docstring():
    tools = load_tools(SPECS)
    assert tools["add"].schema() == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "number"}},
                "required": ["a"],
            },
        },
    }


def test_dispatch_answers_every_invalid_call():
    tools = load_tools(SPECS)
    assert dispatch(tools, ToolCall("add", {"a": 2, "b": 0.5})).text == "2.5"
    cases = {
        "error: unknown tool 'sub'; available: add, boom": ToolCall("sub", {}),
        "error: invalid tool call: bad json": ToolCall(error="bad json"),
        "error: bad arguments for add: missing argument(s) ['a']": ToolCall("add", {}),
        "error: bad arguments for add: unknown argument(s) ['c']; add takes ['a', 'b']": ToolCall(
            "add", {"a": 1, "c": 2}
        ),
        "error: bad arguments for add: argument 'a' must be a integer, got \"x\"": ToolCall("add", {"a": "x"}),
        "error: boom raised RuntimeError: disk on fire": ToolCall("boom", {"text": "t"}),
    }
    for want, call in cases.items():
        r = dispatch(tools, call)
        assert (r.text, r.ok) == (want, False)


def test_load_tools_errors_name_the_fix():
    with pytest.raises(ConfigError, match="not a built-in tool"):
        load_tools(["calc"])
    with pytest.raises(ConfigError, match="cannot import module 'no_such_mod'"):
        load_tools(["no_such_mod:f"])
    with pytest.raises(ConfigError, match="no function 'nope'"):
        load_tools(["tests.unit.test_tools:nope"])


def test_tool_env_steps_count_calls_and_errors():
    cfg = Config(env={"fn": "streamrl.envs.tool_env:ToolEnv"}, tools={"names": SPECS, "max_output_chars": 64})
    make = env_factory(resolve_env(cfg.env.fn), cfg)
    env = make()
    env.reset({"text": "q", "meta": {}})
    turn = (
        '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": {a}}</tool_call>{"name": "x"}'
    )
    text, reward, done, info = check_step(env.step(turn))
    assert not done and reward == 0.0
    assert info["counts"] == {"tool_calls": 2, "tool_errors": 1}
    assert info["messages"][0] == {"role": "tool", "content": "2.0"}
    assert info["messages"][1]["content"].startswith("error: invalid tool call: the <tool_call> body is not valid JSON")
    assert text.startswith("\n<tool_response>\n2.0\n</tool_response>\n<tool_response>\nerror:")
    assert check_step(env.step("The answer is 3.")) == (
        "",
        0.0,
        True,
        {"messages": [], "counts": {"tool_calls": 0, "tool_errors": 0}},
    )


def test_untagged_turn_is_a_call_and_config_errors():
    env = ToolEnv(load_tools(SPECS), Config(tools={"names": SPECS, "untagged": "boom"}).tools)
    _, _, done, info = env.step("just text")
    assert not done and info["tool_calls"] == 1 and info["tool_errors"] == 1
    with pytest.raises(ConfigError, match="not in tools.names"):
        ToolEnv(load_tools(SPECS), Config(tools={"names": SPECS, "untagged": "python"}).tools)
    with pytest.raises(ConfigError, match="needs a tool of one string argument"):
        ToolEnv(load_tools(SPECS), Config(tools={"names": SPECS, "untagged": "add"}).tools)
    with pytest.raises(ConfigError, match="set tools.names"):
        env_factory(ToolEnv, Config())
    with pytest.raises(ValueError, match="neither a built-in tool"):
        Config(tools={"names": ["a b"]})


def test_clip_keeps_head_and_tail():
    out = clip("A" * 50 + "TAIL", 20)
    assert out.startswith("A" * 10) and out.endswith("AATAIL"[-10:]) and "characters cut" in out


def test_episode_metrics_sum_env_counters():
    from types import SimpleNamespace

    from streamrl.generate.episode_sample import episode_metrics

    def ep(calls, errors):
        return SimpleNamespace(
            meta={
                "turns": 2,
                "env_step_s": [0.1],
                "env_tokens": 3,
                "env_counts": {"tool_calls": calls, "tool_errors": errors},
            }
        )

    m = episode_metrics([ep(2, 1), ep(3, 0), SimpleNamespace(meta={"turns": 1, "env_step_s": [0.2]})])
    assert (m["tool_calls"], m["tool_errors"]) == (5, 1)
    assert "tool_calls" not in episode_metrics([SimpleNamespace(meta={"turns": 1, "env_step_s": [0.2]})])


def test_preflight_reports_a_tool_that_cannot_load():
    from streamrl.envs.tools import check_tools

    assert check_tools(Config(tools={"names": SPECS})) is None
    assert "cannot import module 'no_such_mod'" in check_tools(Config(tools={"names": ["no_such_mod:f"]}))
