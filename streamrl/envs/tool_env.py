"""The tool-use environment: each model turn's tool calls are run, their results are the observation.

    env: {fn: streamrl.envs.tool_env:ToolEnv, max_turns: 4}
    tools: {chat: true, names: [python]}                  # docs/tools.md

A turn with tool calls (Hermes tags or OpenAI-style JSON, streamrl/envs/tool_calls.py) is answered with
one `tool` message per call, in order; an invalid call (bad JSON, unknown tool, bad arguments) or a
failing tool is answered with an error message in its place, so the model can correct itself and
the episode goes on. A turn without a tool call is the final answer: the episode ends (the reward
workers score it, e.g. reward.fn=math). With tools.untagged set, such a turn is instead a call of
that tool with the whole turn as its argument (for models that cannot emit the call format).
Every step reports `tool_calls` and `tool_errors`, summed per episode into metrics.jsonl.
"""

from __future__ import annotations

from streamrl.config.schema import Config
from streamrl.config.tools import ToolsConfig
from streamrl.core.errors import ConfigError
from streamrl.envs.base import Env
from streamrl.envs.tool_calls import ToolCall, parse_tool_calls
from streamrl.envs.tools import Tool, dispatch, load_tools


class ToolEnv(Env):
    replayable = True
    """Replay re-runs the calls; the built-in python tool starts from a fresh scratch directory each call."""

    def __init__(self, tools: dict[str, Tool], cfg: ToolsConfig):
        if cfg.untagged is not None and cfg.untagged not in tools:
            raise ConfigError(f"tools.untagged={cfg.untagged!r} is not in tools.names {sorted(tools)}; add it there")
        self.tools, self.cfg = tools, cfg
        self.item: dict = {}
        self._untagged_arg = None
        if cfg.untagged is not None:
            schema = tools[cfg.untagged].parameters
            params = schema.get("required") or list(schema["properties"])
            if len(params) != 1 or schema["properties"][params[0]].get("type") not in (None, "string"):
                raise ConfigError(
                    f"tools.untagged={cfg.untagged!r} does not take exactly one string argument; it "
                    "needs a tool of one string argument (the turn's text), e.g. python"
                )
            self._untagged_arg = params[0]

    @classmethod
    def from_config(cls, cfg: Config) -> ToolEnv:
        if not cfg.tools.names:
            raise ConfigError("env.fn=streamrl.envs.tool_env:ToolEnv offers no tools; set tools.names, e.g. [python]")
        return cls(load_tools(cfg.tools.names, cfg.tools.sandbox), cfg.tools)

    def reset(self, item: dict) -> None:
        self.item = item

    def step(self, action: str):
        calls = parse_tool_calls(action)
        if not calls and self._untagged_arg is not None:
            calls = [ToolCall(name=self.cfg.untagged, arguments={self._untagged_arg: action})]
        if not calls:
            return "", 0.0, True, {"tool_calls": 0, "tool_errors": 0}
        results = [dispatch(self.tools, c, self.cfg.max_output_chars) for c in calls]
        messages = [{"role": "tool", "content": r.text} for r in results]
        # Plain-text episodes (tools.chat=false) append this text; chat ones render `messages`.
        text = "".join(f"\n<tool_response>\n{r.text}\n</tool_response>" for r in results) + "\n"
        return (
            text,
            0.0,
            False,
            {"messages": messages, "tool_calls": len(calls), "tool_errors": sum(not r.ok for r in results)},
        )
