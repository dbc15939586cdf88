"""Task loaders and the character tokenizer: pytest tests/unit/test_tasks.py"""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import pytest

from streamrl.config.schema import Config, TaskConfig, TinyModelConfig
from streamrl.core.errors import ConfigError
from streamrl.feed.sources import GSM8K_TEMPLATE, load_task, parse_gsm8k_answer
from streamrl.models.tiny import CHARS, build_tokenizer, fingerprint, vocab
from streamrl.tasks.charclass import CHAR_CLASSES


def test_tokenizer_round_trips_every_task_character():
    tok = build_tokenizer()
    text = CHARS + "Janet's ducks lay 16 eggs.\n#### 18"
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert len(ids) == len(text) + 1 and tok.unk_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert tok("é")["input_ids"][1:] == [tok.unk_token_id]


def test_vocab_is_specials_then_unique_chars():
    v = vocab()
    assert len(v) == 4 + len(CHARS) == len(set(CHARS)) + 4
    assert sorted(v.values()) == list(range(len(v)))


def test_fingerprint_depends_on_config_and_seed():
    base = fingerprint(TinyModelConfig(), 0)
    assert base == fingerprint(TinyModelConfig(), 0)
    assert base != fingerprint(TinyModelConfig(), 1)
    assert base != fingerprint(TinyModelConfig(num_layers=3), 0)


def test_charclass_is_balanced_seeded_and_msgpackable():
    items = load_task(TaskConfig(num_prompts=40, charclass_length=12), seed=3)
    assert len(items) == 40
    assert items == load_task(TaskConfig(num_prompts=40, charclass_length=12), seed=3)
    assert items != load_task(TaskConfig(num_prompts=40, charclass_length=12), seed=4)
    counts = {name: sum(it["meta"]["cls"] == name for it in items) for name in CHAR_CLASSES}
    assert counts == {name: 10 for name in CHAR_CLASSES}
    for it in items:
        assert it["text"] == f"{it['meta']['cls']}:"
        assert it["meta"]["chars"] == CHAR_CLASSES[it["meta"]["cls"]] and it["meta"]["length"] == 12
        assert msgpack.unpackb(msgpack.packb(it)) == it
    assert all(set(chars) <= set(CHARS) for chars in CHAR_CLASSES.values())


def _write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_gsm8k_loader(tmp_path: Path):
    path = _write_jsonl(
        tmp_path / "train.jsonl",
        [
            json.dumps({"question": "What is 6*7? ", "answer": "6*7=<<6*7=42>>42\n#### 42"}),
            "",
            json.dumps({"question": "Big?", "answer": "so #### 1,250"}),
            json.dumps({"question": "Neg?", "answer": "#### -3.5"}),
        ],
    )
    items = load_task(TaskConfig(name="gsm8k", path=str(path)), seed=0)
    assert [it["meta"]["answer"] for it in items] == ["42", "1250", "-3.5"]
    assert (
        items[0]["text"]
        == GSM8K_TEMPLATE.format(question="What is 6*7?")
        == ("What is 6*7?\nEnd with the final answer on its own line as '#### <number>'.\nAnswer:")
    )
    assert all(it["meta"]["task"] == "gsm8k" for it in items)


@pytest.mark.parametrize(
    "line, match",
    [
        ('{"question": "q", "answer": "no final"', r"bad\.jsonl:2: not valid JSON"),
        ('{"question": "q"}', r"bad\.jsonl:2: expected a field 'answer'.*set task\.fields\.answer"),
        ('{"answer": "#### 1"}', r"bad\.jsonl:2: expected a text field 'question'.*set task\.fields\.prompt"),
        ('["q", "a"]', r"bad\.jsonl:2: expected"),
        ('{"question": "q", "answer": "it is 5"}', r"bad\.jsonl:2: answer has no '#### <number>'"),
        ('{"question": "q", "answer": "#### five"}', r"bad\.jsonl:2: final answer 'five'.*not a number"),
    ],
)
def test_gsm8k_errors_name_file_and_line(tmp_path: Path, line: str, match: str):
    good = json.dumps({"question": "q", "answer": "#### 1"})
    path = _write_jsonl(tmp_path / "bad.jsonl", [good, line])
    with pytest.raises(ConfigError, match=match):
        load_task(TaskConfig(name="gsm8k", path=str(path)), seed=0)


def test_gsm8k_missing_or_empty_file(tmp_path: Path):
    with pytest.raises(ConfigError, match="does not exist; set task.path"):
        load_task(TaskConfig(name="gsm8k", path=str(tmp_path / "nope.jsonl")), seed=0)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ConfigError, match="holds no records"):
        load_task(TaskConfig(name="gsm8k", path=str(tmp_path / "empty.jsonl")), seed=0)
    with pytest.raises(ValueError, match="set task.path"):  # at config time now, before anything starts
        TaskConfig(name="gsm8k")


def test_parse_gsm8k_answer():
    assert parse_gsm8k_answer("a #### b #### 7.") == "7"
    with pytest.raises(ValueError):
        parse_gsm8k_answer("42")


def test_default_config_is_vllm_cpu_compatible():
    tiny = Config().model.tiny
    assert tiny.hidden_size // tiny.num_heads in (32, 64, 80, 96, 112, 128, 256)
    cfg = Config()
    assert cfg.task.charclass_chars(cfg.generator.max_tokens) == cfg.generator.max_tokens
    # it follows generator.max_tokens (no validator writes it), unless set
    longer = Config.model_validate({"generator": {"max_tokens": 24}})
    assert load_task(longer.task, seed=0, max_tokens=longer.generator.max_tokens)[0]["meta"]["length"] == 24
    assert (
        Config.model_validate({"generator": {"max_tokens": 24}, "task": {"charclass_length": 8}}).task.charclass_chars(
            24
        )
        == 8
    )
