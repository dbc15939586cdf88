"""Single-turn prompts go through the model's chat template by default when the tokenizer has one
(task.chat_template=auto), raw text when asked (false) or when there is none (issue 43, item 4): the
rule (Config.chat_prompts), the template read from a model folder's files the way transformers reads it,
the feeder's rendering with a real tokenizer, the line `up` and `config --explain` print, and the
pre-flight refusal of task.chat_template=true without a template."""

from __future__ import annotations

import json

import pytest

from streamrl.config.files import load_config
from streamrl.core.errors import ConfigError
from streamrl.models.chat_template import check_chat_template, has_chat_template, prompt_format
from streamrl.models.tiny import build_tokenizer
from workers.feeder import task_items

ITEMS = [{"text": "digits:", "meta": {"answer": "1"}}]


def cfg(*overrides: str):
    return load_config(None, list(overrides))


def test_the_rule_auto_uses_a_template_where_there_is_one_and_the_job_is_single_turn():
    assert cfg().task.chat_template == "auto"
    assert cfg().chat_prompts(has_template=True) and not cfg().chat_prompts(has_template=False)
    assert not cfg("task.chat_template=false").chat_prompts(has_template=True)
    assert cfg("task.chat_template=true").chat_prompts(has_template=False)  # the feeder then fails, naming why
    assert not cfg("env.fn=charclass_dialog").chat_prompts(has_template=True)  # episodes: tools.chat decides
    assert cfg("env.fn=charclass_dialog", "tools.chat=true").chat_prompts(has_template=True)
    with pytest.raises(ConfigError, match="tools.chat=true .* task.chat_template=false"):
        cfg("tools.chat=true", "task.chat_template=false")


def test_a_template_is_found_in_each_file_transformers_reads_it_from(tmp_path):
    build_tokenizer(chat=True).save_pretrained(tmp_path / "chat")
    build_tokenizer(chat=False).save_pretrained(tmp_path / "plain")
    assert has_chat_template(tmp_path / "chat") is True
    assert has_chat_template(tmp_path / "plain") is False
    (tmp_path / "jinja").mkdir()
    (tmp_path / "jinja" / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    (tmp_path / "jinja" / "chat_template.jinja").write_text("{{ messages }}")
    assert has_chat_template(tmp_path / "jinja") is True
    assert has_chat_template("nobody-has/this-model-9f3e") is None  # a hub id not in the local cache


def test_the_feeder_renders_with_the_template_by_default_and_raw_when_asked():
    chat_tok, plain_tok = build_tokenizer(chat=True), build_tokenizer(chat=False)
    rendered = task_items(ITEMS, chat_tok, cfg())
    assert rendered[0]["text"].startswith("<|im_start|>user\ndigits:<|im_end|>")
    assert rendered[0]["text"].endswith("<|im_start|>assistant\n")
    assert rendered[0]["meta"] == {"question": "digits:", "answer": "1"}  # the raw text kept for rewards
    assert task_items(ITEMS, chat_tok, cfg("task.chat_template=false")) == ITEMS
    assert task_items(ITEMS, plain_tok, cfg()) == ITEMS  # no template: raw text, as the tiny job trains
    with pytest.raises(ConfigError, match="task.chat_template=true"):
        task_items(ITEMS, plain_tok, cfg("task.chat_template=true"))


def test_the_console_line_says_which_and_names_the_setting(tmp_path):
    build_tokenizer(chat=True).save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    line = prompt_format(cfg(f"model.path={tmp_path}"))
    assert "rendered with the chat template" in line and "--set task.chat_template=false for raw text" in line
    assert prompt_format(cfg()) == (
        "prompts: raw text (the model's tokenizer has no chat template; task.chat_template=auto)"
    )  # the tiny model: no template
    assert "raw text (task.chat_template=false)" in prompt_format(
        cfg(f"model.path={tmp_path}", "task.chat_template=false")
    )
    assert "not in the local cache" in prompt_format(cfg("model.path=nobody-has/this-model-9f3e"))


def test_pre_flight_refuses_true_without_a_template():
    problem = check_chat_template(cfg("task.chat_template=true"))
    assert "model.tiny.chat_template=true" in problem and "task.chat_template=auto" in problem
    assert check_chat_template(cfg("task.chat_template=true", "model.tiny.chat_template=true")) is None
    assert check_chat_template(cfg()) is None


def test_config_explain_says_how_prompts_are_rendered(capsys):
    from streamrl.cli import main

    assert main(["config", "--no-preflight", "--explain", "--set", "model.tiny.chat_template=true"]) == 0
    out = capsys.readouterr().out
    assert "  chat_template: auto  # [prompts: rendered with the chat template" in out
