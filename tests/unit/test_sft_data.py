"""SFT data: loss masks per assistant turn (all / last) through a Qwen-style chat template with
tools, prompt/completion pairs, truncation and bad rows, packing layout, the data order.

    pytest tests/unit/test_sft_data.py
"""

from __future__ import annotations

import numpy as np
import pytest

from streamrl.config.schema import Config, SFTConfig
from streamrl.models.document_attention import document_mask
from streamrl.models.tiny import build_tokenizer
from streamrl.sft.data import Sample, SampleError, charclass_demos, step_indices, tokenize_row
from streamrl.sft.pack import collate, plan_micro_batches

# Qwen2.5-style ChatML: tools in the system turn, tool results as user turns, tool calls after content.
# (transformers renders with trim_blocks: a newline right after a block tag is dropped, hence {{ '\\n' }}.)
QWEN_STYLE = (
    "{% if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}<|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'system' and loop.first %}"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% if m.tool_calls is defined %}{% for c in m.tool_calls %}{{ '\\n' }}<tool_call>\n{{ c.function | tojson }}\n</tool_call>"
    "{% endfor %}{% endif %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
CALL = {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "1+2?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "content": "3"},
    {"role": "assistant", "content": "It is 3."},
    {"role": "user", "content": "And 2+2?"},
    {"role": "assistant", "content": "4."},
]


@pytest.fixture(scope="module")
def tok():
    t = build_tokenizer()
    t.chat_template = QWEN_STYLE
    return t


def trained_text(tok, sample: Sample) -> list[str]:
    """The trained tokens as text, one string per contiguous masked run."""
    runs, current = [], []
    for i, m in zip(sample.ids, sample.mask):
        if m:
            current.append(int(i))
        elif current:
            runs.append(tok.decode(current)), current.clear()
    if current:
        runs.append(tok.decode(current))
    return runs


def test_all_assistant_turns_are_trained_and_nothing_else(tok):
    sft = SFTConfig(assistant_turns="all")
    s = tokenize_row(tok, {"messages": CONVERSATION, "tools": TOOLS}, sft)
    call = '\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    assert trained_text(tok, s) == [call + "<|im_end|>\n", "It is 3.<|im_end|>\n", "4.<|im_end|>\n"]
    text = tok.decode(s.ids.tolist())
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n") and "<tool_response>\n3\n" in text
    assert s.loss_tokens == int(s.mask.sum())  # the first token (never a target) is not trained


def test_only_the_last_assistant_turn(tok):
    s = tokenize_row(tok, {"messages": CONVERSATION, "tools": TOOLS}, SFTConfig(assistant_turns="last"))
    assert trained_text(tok, s) == ["4.<|im_end|>\n"]
    full = tokenize_row(tok, {"messages": CONVERSATION, "tools": TOOLS}, SFTConfig())
    assert np.array_equal(s.ids, full.ids)  # same tokens, only the mask differs


def test_columnar_rows_with_none_keys_and_json_tools(tok):
    # parquet/datasets rows carry every key, None where absent, and tools often as a JSON string.
    messages = [{**m, "tool_calls": m.get("tool_calls")} for m in CONVERSATION]
    import json

    s = tokenize_row(tok, {"messages": messages, "tools": json.dumps(TOOLS)}, SFTConfig())
    ref = tokenize_row(tok, {"messages": CONVERSATION, "tools": TOOLS}, SFTConfig())
    assert np.array_equal(s.ids, ref.ids) and np.array_equal(s.mask, ref.mask)


def test_a_template_that_rewrites_history_is_reported(tok):
    t = build_tokenizer()
    # Renders only the newest assistant message: earlier turns change once later ones follow.
    t.chat_template = (
        "{% for m in messages %}{% if m.role != 'assistant' or loop.last %}{{ m.role }}:{{ m.content }}\n"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
    )
    with pytest.raises(SampleError, match="assistant_turns=last"):
        tokenize_row(t, {"messages": CONVERSATION}, SFTConfig(assistant_turns="all"))
    s = tokenize_row(t, {"messages": CONVERSATION}, SFTConfig(assistant_turns="last"))
    assert trained_text(t, s) == ["4.\n"]


def test_a_template_error_is_one_bad_row():
    t = build_tokenizer()
    t.chat_template = (
        "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}"
        "{{ raise_exception('unknown role ' + m.role) }}{% endif %}{{ m.content }}{% endfor %}"
    )
    with pytest.raises(SampleError, match="unknown role robot"):
        tokenize_row(
            t, {"messages": [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "y"}]}, SFTConfig()
        )


def test_prompt_completion_pairs(tok):
    s = tokenize_row(tok, {"prompt": "digits:", "completion": "123"}, SFTConfig())
    assert tok.decode(s.ids.tolist(), skip_special_tokens=False) == "digits:123</s>"
    assert s.mask.tolist() == [0] * 7 + [1] * 4
    # The prompt tokens are exactly what the RL feeder sends (no special tokens added).
    assert s.ids[:7].tolist() == tok("digits:", add_special_tokens=False)["input_ids"]


def test_truncation_and_bad_rows(tok):
    sft = SFTConfig(max_seq_len=9)
    s = tokenize_row(tok, {"prompt": "digits:", "completion": "12345"}, sft)
    assert s.truncated and len(s.ids) == 9 and s.loss_tokens == 2
    with pytest.raises(SampleError, match="no loss token"):
        tokenize_row(tok, {"prompt": "digits:12", "completion": "3"}, SFTConfig(max_seq_len=9))
    with pytest.raises(SampleError, match="neither `messages`"):
        tokenize_row(tok, {"question": "x"}, SFTConfig())
    with pytest.raises(SampleError, match="no assistant message"):
        tokenize_row(tok, {"messages": [{"role": "user", "content": "hi"}]}, SFTConfig())
    plain = build_tokenizer()  # the tiny tokenizer has no chat template
    with pytest.raises(SampleError, match="no chat template"):
        tokenize_row(plain, {"messages": CONVERSATION}, SFTConfig())


def test_charclass_demos_score_one():
    from streamrl.tasks.charclass import charclass_items, charclass_reward

    demos = charclass_demos(40, 16, seed=0)
    metas = {i["text"]: i["meta"] for i in charclass_items(4, 16, 0)}
    assert len(demos) == 40 and all(len(d["completion"]) == 16 for d in demos)
    assert all(charclass_reward(d["prompt"], d["completion"], metas[d["prompt"]]) == 1.0 for d in demos)


def _sample(n: int, first_trained: int = 1) -> Sample:
    mask = np.zeros(n, np.float32)
    mask[first_trained:] = 1
    return Sample(np.arange(10, 10 + n, dtype=np.int64), mask)


def test_packing_layout_has_no_padding_and_per_document_targets():
    a, b = _sample(3), _sample(4, first_trained=2)
    t = collate([a, b], packing=True, pad_id=0)
    assert t["input_ids"].tolist() == [[10, 11, 12, 10, 11, 12, 13]]
    assert t["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3]]
    # Each document's last token predicts nothing (never the next document's first token).
    assert t["targets"][0, :2].tolist() == [11, 12] and t["targets"][0, 3:6].tolist() == [11, 12, 13]
    assert t["mask"].tolist() == [[1, 1, 0, 0, 1, 1, 0]]
    m = document_mask(t["position_ids"])[0, 0]
    assert m[4, 3] and not m[4, 2] and not m[3, 4] and m[2, 0]
    p = collate([a, b], packing=False, pad_id=0)
    assert p["input_ids"].shape == (2, 4) and p["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert float(p["mask"].sum()) == float(t["mask"].sum())


def test_micro_batches_respect_the_token_budget():
    samples = [_sample(n) for n in (5, 5, 5, 9, 2)]
    assert [[len(s.ids) for s in g] for g in plan_micro_batches(samples, 10, packing=True)] == [[5, 5], [5], [9], [2]]
    # Padded rows cost rows x longest.
    assert [[len(s.ids) for s in g] for g in plan_micro_batches(samples, 10, packing=False)] == [[5, 5], [5], [9], [2]]
    assert [[len(s.ids) for s in g] for g in plan_micro_batches(samples, 18, packing=False)] == [[5, 5, 5], [9, 2]]
    assert collate([], packing=True, pad_id=0)["mask"].sum() == 0


def test_data_order_is_a_function_of_the_step():
    n, bs = 10, 4
    first = [step_indices(n, s, bs, seed=3) for s in range(5)]
    assert first == [step_indices(n, s, bs, seed=3) for s in range(5)]
    flat = [i for step in first for i in step]
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:20]) == list(range(10))  # epochs
    assert flat[:10] != flat[10:20]  # reshuffled per epoch


def test_config_rejects_a_budget_below_max_seq_len():
    with pytest.raises(ValueError, match="micro_batch_tokens"):
        Config.model_validate({"sft": {"max_seq_len": 100, "micro_batch_tokens": 50}})
