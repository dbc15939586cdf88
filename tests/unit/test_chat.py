"""Chat-template episodes are token-exact: the prompt rendered from messages plus every model turn and
every observation delta equals the whole conversation rendered at once (3+ turns), on the tiny
model's Qwen3-style template; and where the template rewrites history (Qwen3 drops earlier
<think> blocks), the delta still extends what the model saw while a re-render would not."""

from __future__ import annotations

import itertools

import pytest

from streamrl.config.tools import ToolsConfig
from streamrl.core.errors import ConfigError
from streamrl.generate.chat import ChatBridge, chat_items
from streamrl.generate.episode_sample import EpisodeSample, split_extension
from streamrl.models.tiny import build_tokenizer, vocab
from streamrl.models.tiny_chat import IM_END

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "run code",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(chat=True)


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def run_incremental(tok, bridge, question, turns, role):
    """Build the episode as the generator does: prompt ids, then per turn the sampled ids (content +
    the eos the model samples) and the observation's delta ids."""
    s = EpisodeSample(ids(tok, bridge.prompt_text(question)))
    eos = tok.convert_tokens_to_ids(IM_END)
    for action, obs in turns:
        s.add_model(ids(tok, action) + [eos], [0.0] * (len(ids(tok, action)) + 1), 0)
        s.add_observation(bridge.observation_ids([{"role": role, "content": obs}], s.context))
    return s


def test_three_tool_turns_match_a_whole_render(tok):
    cfg = ToolsConfig(chat=True, system="You are terse.", names=["python"])
    bridge = ChatBridge(tok, cfg, TOOLS)
    turns = [
        ('<tool_call>\n{"name": "python", "arguments": {"code": "print(17*23)"}}\n</tool_call>', "391"),
        ('<tool_call>\n{"name": "python", "arguments": {"code": "1/0"}}\n</tool_call>', "ZeroDivisionError"),
        ('checking\n<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>', "error: unknown tool"),
    ]
    s = run_incremental(tok, bridge, "What is 17*23?", turns, "tool")
    messages = bridge.prompt_messages("What is 17*23?")
    for action, obs in turns:
        messages += [{"role": "assistant", "content": action}, {"role": "tool", "content": obs}]
    whole = tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=True)
    whole = whole if isinstance(whole, list) else whole["input_ids"]
    assert s.context == list(whole)
    assert len(s.obs_spans) == 3 and s.model_tokens == sum(len(ids(tok, a)) + 1 for a, _ in turns)


def test_truncated_turn_gets_the_closing_as_observation_tokens(tok):
    bridge = ChatBridge(tok, ToolsConfig(chat=True))
    history = ids(tok, bridge.prompt_text("q")) + ids(tok, "cut mid-wo")  # no eos: hit max_tokens
    delta = bridge.observation_ids([{"role": "user", "content": "go on"}], history)
    assert delta[0] == vocab(chat=True)[IM_END]
    assert tok.decode(delta) == "<|im_end|>\n<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n"


def test_qwen3_think_drift_is_not_inherited(tok):
    """User-role observations after turns with <think>: the template drops the earlier think blocks on a
    re-render (and the empty think of enable_thinking=false), so the whole render is NOT the sequence the
    model was conditioned on. The delta keeps every context a prefix of the next (token-exact)."""
    bridge = ChatBridge(tok, ToolsConfig(chat=True, template_kwargs={"enable_thinking": False}))
    turns = [
        ("<think>\nadd them\n</think>\n\n40", "and times 2?"),
        ("<think>\ndouble\n</think>\n\n80", "minus 1?"),
        ("<think>\nsub\n</think>\n\n79", "thanks"),
    ]
    contexts, s = [], None
    eos = tok.convert_tokens_to_ids(IM_END)
    s = EpisodeSample(ids(tok, bridge.prompt_text("20+20?")))
    for action, obs in turns:
        contexts.append(list(s.context))
        s.add_model(ids(tok, action) + [eos], [0.0] * (len(ids(tok, action)) + 1), 0)
        s.add_observation(bridge.observation_ids([{"role": "user", "content": obs}], s.context))
    contexts.append(list(s.context))
    assert all(split_extension(a, b) is not None for a, b in itertools.pairwise(contexts))
    messages = bridge.prompt_messages("20+20?")
    for action, obs in turns:
        messages += [{"role": "assistant", "content": action}, {"role": "user", "content": obs}]
    rerender = ids(
        tok, tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    )
    assert "add them" not in tok.decode(rerender) and "add them" in tok.decode(s.context)
    assert split_extension(contexts[1], rerender) is None  # a re-render would break the prefix: drift


def test_chat_items_and_missing_template():
    tok = build_tokenizer(chat=True)
    bridge = ChatBridge(tok, ToolsConfig(chat=True))
    [item] = chat_items([{"text": "hi", "meta": {"cls": "digits"}}], bridge)
    assert item["text"] == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert item["meta"] == {"question": "hi", "cls": "digits"}
    with pytest.raises(ConfigError, match="model.tiny.chat_template=true"):
        ChatBridge(build_tokenizer(), ToolsConfig(chat=True))
