"""The `tools` config section: chat-template rendering of episodes and the tools a ToolEnv offers.

    tools: {chat: true, names: [python], untagged: null}      # docs/tools.md

Its own module (not streamrl/config/schema.py) so the tool-use settings live next to each other; Config
holds it as `tools`.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

TOOL_SPEC = re.compile(r"[A-Za-z_]\w*|[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


class ToolsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    chat: bool = False
    """Render each prompt with the model's chat template (the task text as the user message, tool
    schemas in the system turn) and append observations as tool/user messages with the template's
    delta (streamrl/generate/chat.py). Needs a tokenizer with a chat template (an instruct model, or
    model.tiny.chat_template=true). False: prompts and observations are plain text."""
    system: str | None = None
    """System message of the first prompt (chat only); None: none, or the template's default."""
    template_kwargs: dict[str, Any] = {}
    """Extra variables for the chat template, e.g. {enable_thinking: false} for Qwen3."""
    names: list[str] = []
    """Tools the ToolEnv (env.fn=streamrl.envs.tool_env:ToolEnv) dispatches to: built-ins (`python`, the
    sandboxed interpreter) or `package.module:function` (schema from its signature and docstring)."""
    schemas_in_prompt: bool = True
    """Pass the tools' JSON schemas to the chat template (chat only), which lists them in the system turn."""
    untagged: str | None = None
    """A model turn without tool-call markup is a call of this tool with the whole turn as its one
    argument (for base or random models that cannot emit the call format). None: such a turn is
    the final answer and ends the episode."""
    sandbox: dict[str, Any] = {}
    """Limits of the python tool's sandbox: SandboxLimits fields (streamrl/envs/sandbox/executor.py), e.g.
    {wall_s: 5, cpu_s: 3, memory_bytes: 268435456}; unset ones keep its defaults."""
    max_output_chars: int = Field(1000, ge=16)
    """A tool result longer than this is cut (keeping its head and tail) before it becomes an observation."""

    @field_validator("names")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        for spec in value:
            if not TOOL_SPEC.fullmatch(spec):
                raise ValueError(
                    f"tools.names entry {spec!r} is neither a built-in tool (python) nor "
                    "`package.module:function`; e.g. tools.names=[python, my_tools:lookup]"
                )
        if len(set(value)) != len(value):
            raise ValueError(f"tools.names lists a tool twice: {value}")
        return value
