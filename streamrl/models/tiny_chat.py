"""The tiny model's chat variant (model.tiny.chat_template=true): Qwen-style turn tokens and template.

The template follows Qwen3's (tokenizer_config.json of Qwen/Qwen3-*) in everything that matters for
multi-turn token exactness, so CI tests the same behaviour offline:
- `<|im_start|>role\\n ... <|im_end|>\\n` turns; the model's turn ends with the eos `<|im_end|>`;
- tool schemas listed in the system turn, Hermes `<tool_call>` format explained there;
- consecutive tool messages grouped into one user turn of `<tool_response>` blocks;
- Qwen3's drift: an assistant turn's `<think>` block is dropped on re-render once a later user
  message exists (and an empty think block is rendered only for the last turn), so rendering
  the whole conversation again differs from what the model was conditioned on.
"""

from __future__ import annotations

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
CHAT_TOKENS = [IM_START, IM_END]
"""Special tokens the chat variant adds after the character vocabulary (ids 100, 101)."""

QWEN3_STYLE_TEMPLATE = (
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}"
    "{{ '\\n' }}</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
    "{% elif messages[0].role == 'system' %}"
    "<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% set ns = namespace(last_query_index=-1) %}"
    "{% for m in messages %}{% if m.role == 'user' %}{% set ns.last_query_index = loop.index0 %}{% endif %}"
    "{% endfor %}"
    "{% for m in messages %}"
    "{% if m.role == 'user' or (m.role == 'system' and not loop.first) %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% elif m.role == 'assistant' %}"
    "{% set content = m.content or '' %}{% set reasoning = '' %}"
    "{% if '</think>' in content %}"
    "{% set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\n') %}"
    "{% set content = content.split('</think>')[-1].lstrip('\n') %}"
    "{% endif %}"
    "{% if loop.index0 > ns.last_query_index and (loop.last or reasoning) %}"
    "<|im_start|>assistant\n<think>\n{{ reasoning }}\n</think>\n\n{{ content }}"
    "{% else %}"
    "<|im_start|>assistant\n{{ content }}"
    "{% endif %}"
    "{% for call in m.tool_calls or [] %}{% set f = call.function or call %}"
    '{{ \'\\n\' }}<tool_call>\n{"name": "{{ f.name }}", "arguments": {{ f.arguments | tojson }}}\n</tool_call>'
    "{% endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{% elif m.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n' }}<tool_response>\n{{ m.content }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)
