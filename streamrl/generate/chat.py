"""Chat templates for multi-turn episodes, token-exact: render the first prompt from messages with the
model's own template; append each observation as the template's delta, never a re-render.

    bridge = ChatBridge(tokenizer, cfg.tools, tool_schemas)
    text = bridge.prompt_text("What is 17 * 23?")                    # the feeder tokenizes it
    ids = bridge.observation_ids([{"role": "tool", "content": "391"}], history_ids)

The delta of an observation is what the template writes between the end of an assistant turn's
content and the start of the next assistant turn's content: rendered on a fixed stand-in
conversation (user "U", assistant SENTINEL, then the new messages, then the generation prompt)
and cut right after SENTINEL. It depends only on what the template writes after an assistant's
content, never on how it renders earlier turns, so templates that rewrite history on re-render
(Qwen3 drops earlier `<think>` blocks; verl #3720/#3960, prime-rl #1352) cannot shift the tokens
the model was conditioned on. If the model's turn already ended with the delta's first token (it
sampled the end-of-turn token `<|im_end|>`), that token is not appended twice; a turn cut at
max_tokens gets the whole closing appended as observation tokens (loss mask 0).

Why not the `renderers` package (docs/tools.md): its hand-written renderers cover named model
families only, and for any other template (the tiny model's, a user's fine-tune) its
`bridge_to_next_turn` returns None and asks for a full re-render, the drift-prone path.
"""

from __future__ import annotations

from typing import Any

from streamrl.config.tools import ToolsConfig
from streamrl.core.errors import ConfigError

SENTINEL = "STREAMRLASSISTANTCONTENT0x5f3759df"
"""Stand-in assistant content: never produced by a template, located to cut the delta."""


class ChatBridge:
    def __init__(self, tokenizer, cfg: ToolsConfig, tool_schemas: list[dict] | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                "tools.chat=true (or task.chat_template=true) needs a tokenizer with a chat template, but "
                "model.path's has none; use an instruct/chat model, set model.tiny.chat_template=true for the "
                "tiny model, or set tools.chat=false and task.chat_template=auto"
            )
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.tools = tool_schemas if (tool_schemas and cfg.schemas_in_prompt) else None
        eos = tokenizer.eos_token_id
        self.end_ids = {eos} if isinstance(eos, int) else set(eos or [])

    def _render(self, messages: list[dict], generation_prompt: bool, tools=None) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt, **self.cfg.template_kwargs
        )

    def prompt_messages(self, text: str) -> list[dict]:
        system = [{"role": "system", "content": self.cfg.system}] if self.cfg.system else []
        return [*system, {"role": "user", "content": text}]

    def prompt_text(self, text: str) -> str:
        """The first prompt, rendered with the template (tool schemas in it) and the generation prompt."""
        return self._render(self.prompt_messages(text), True, self.tools)

    def delta_text(self, messages: list[dict]) -> str:
        """What the template writes after an assistant's content, for `messages`, up to the next
        assistant's content (generation prompt included)."""
        stand_in = [{"role": "user", "content": "U"}, {"role": "assistant", "content": SENTINEL}]
        rendered = self._render(stand_in + list(messages), True)
        at = rendered.find(SENTINEL)
        if at < 0:
            raise ConfigError(
                "the chat template does not render an assistant message's content verbatim, so "
                "observations cannot be appended token-exactly; set tools.chat=false"
            )
        return rendered[at + len(SENTINEL) :]

    def observation_ids(self, messages: list[dict], history: list[int]) -> list[int]:
        """Token ids that append `messages` (tool/user turns) to `history`, which ends with a model turn."""
        ids = self.tokenizer(self.delta_text(messages), add_special_tokens=False)["input_ids"]
        if ids and history and history[-1] in self.end_ids and ids[0] == history[-1]:
            ids = ids[1:]  # the model sampled the end-of-turn token itself
        return ids


def chat_items(items: list[dict], bridge: ChatBridge) -> list[dict]:
    """Task items with their text rendered as the first chat prompt; meta["question"] keeps the raw text
    unless the task set one."""
    out = []
    for item in items:
        meta: dict[str, Any] = {"question": item["text"], **item["meta"]}
        out.append({"text": bridge.prompt_text(item["text"]), "meta": meta})
    return out
