"""The dataset task loader on data made here, offline: pytest tests/unit/test_datasets.py -q

Local jsonl and parquet files, a folder read by Hugging Face `datasets` (splits from file names),
a builder with data_files, streaming, chat messages rendered with a chat template, the gsm8k
preset through the same loader, and errors that name the record and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamrl.config.schema import Config, TaskConfig
from streamrl.core.errors import ConfigError
from streamrl.feed.sources import load_task
from streamrl.launch.preflight import check_task
from streamrl.models.tiny import build_tokenizer

RECORDS = [{"q": f"What is {i} + {i}?", "a": 2 * i, "level": i % 3, "extra": [i]} for i in range(6)]
TASK = {"name": "dataset", "fields": {"prompt": "q", "answer": "a", "meta": ["level"]}, "template": "Q: {prompt}\nA:"}


@pytest.fixture(autouse=True)
def _private_hf_cache(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def task(**kw) -> TaskConfig:
    return TaskConfig.model_validate({**TASK, **kw})


def expected(rows: list[dict]) -> list[dict]:
    return [
        {"text": f"Q: {r['q']}\nA:", "meta": {"task": "dataset", "answer": str(r["a"]), "level": r["level"]}}
        for r in rows
    ]


def test_local_jsonl_and_parquet_give_the_same_items(tmp_path):
    want = expected(RECORDS)
    assert load_task(task(path=str(write_jsonl(tmp_path / "d.jsonl", RECORDS))), seed=0) == want
    assert load_task(task(path=str(write_parquet(tmp_path / "d.parquet", RECORDS))), seed=0) == want
    assert load_task(task(path=str(tmp_path / "d.jsonl"), max_items=2), seed=0) == want[:2]


def test_hf_folder_split_and_builder_with_data_files(tmp_path):
    folder = tmp_path / "my_dataset"
    write_jsonl(folder / "train.jsonl", RECORDS[:4])
    write_jsonl(folder / "test.jsonl", RECORDS[4:])
    assert load_task(task(path=str(folder)), seed=0) == expected(RECORDS[:4])
    assert load_task(task(dataset={"path": str(folder), "split": "test"}), seed=0) == expected(RECORDS[4:])
    files = {
        "train": str(write_parquet(tmp_path / "p" / "a.parquet", RECORDS[:3])),
        "test": str(write_parquet(tmp_path / "p" / "b.parquet", RECORDS[3:])),
    }
    cfg = task(dataset={"path": "parquet", "data_files": files, "split": "test"})
    assert load_task(cfg, seed=0) == expected(RECORDS[3:])


def test_streaming_reads_only_max_items(tmp_path):
    folder = tmp_path / "big"
    write_jsonl(folder / "train.jsonl", RECORDS * 50)
    cfg = task(dataset={"path": str(folder), "streaming": True}, max_items=5)
    assert load_task(cfg, seed=0) == expected(RECORDS[:5])
    with pytest.raises(ValueError, match="set task.max_items"):
        task(dataset={"path": str(folder), "streaming": True})


def test_chat_messages_use_the_tokenizer_chat_template(tmp_path):
    rows = [
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}], "answer": "4"}
    ]
    cfg = task(path=str(write_jsonl(tmp_path / "chat.jsonl", rows)), fields={"messages": "messages"})
    tok = build_tokenizer()
    with pytest.raises(ConfigError, match="needs a tokenizer with a chat template"):
        load_task(cfg, seed=0, tokenizer=tok)
    tok.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>"
    (item,) = load_task(cfg, seed=0, tokenizer=tok)
    assert item == {"text": "<system>be brief\n<user>2+2?\n<assistant>", "meta": {"task": "dataset", "answer": "4"}}


ASKS = "End with the final answer on its own line as '#### <number>'."
"""The line the gsm8k preset adds: the format reward.fn=math reads (docs/rewards.md)."""


def test_gsm8k_is_a_preset_of_the_same_loader(tmp_path):
    rows = [{"question": "6*7?", "answer": "6*7=42\n#### 42"}, {"question": "big?", "answer": "#### 1,250"}]
    folder = tmp_path / "gsm"
    write_parquet(folder / "train.parquet", rows)
    items = load_task(TaskConfig(name="gsm8k", path=str(folder)), seed=0)
    assert items == [
        {"text": f"6*7?\n{ASKS}\nAnswer:", "meta": {"task": "gsm8k", "answer": "42"}},
        {"text": f"big?\n{ASKS}\nAnswer:", "meta": {"task": "gsm8k", "answer": "1250"}},
    ]


def test_errors_name_the_record_and_the_fix(tmp_path):
    bad = write_parquet(tmp_path / "bad.parquet", [{"q": "x", "a": 1, "level": 0}, {"q": None, "a": 2, "level": 0}])
    with pytest.raises(ConfigError, match=r"bad\.parquet: row 1: expected a text field 'q'.*task\.fields\.prompt"):
        load_task(task(path=str(bad)), seed=0)
    nested = write_jsonl(tmp_path / "n.jsonl", [{"q": "x", "a": 1, "level": [1]}])
    with pytest.raises(ConfigError, match=r"n\.jsonl:1: task\.fields\.meta lists 'level'"):
        load_task(task(path=str(nested)), seed=0)
    with pytest.raises(ConfigError, match=r"load_dataset\(.*nope.*failed.*set task\.path"):
        load_task(task(path=str(tmp_path / "nope")), seed=0)
    with pytest.raises(ConfigError, match="does not exist; set task.path"):
        load_task(task(path=str(tmp_path / "nope.parquet")), seed=0)
    assert "does not exist" in check_task(Config.model_validate({"task": {**TASK, "path": str(tmp_path / "nope")}}))
    assert "task.fields.meta lists 'level'" in check_task(
        Config.model_validate({"task": {**TASK, "path": str(nested)}})
    )


def test_config_refuses_a_file_without_the_answer_column(tmp_path, capsys):
    """The pre-flight reads the first rows: a missing column stops `streamrl config`, not the feeder."""
    from streamrl.cli import main

    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "1 + 1?"}])
    code = main(
        ["config", "--set", "task.name=dataset", "--set", f"task.path={path}", "--set", "task.fields.prompt=question"]
    )
    err = capsys.readouterr().err
    assert code != 0 and "expected a field 'answer'" in err and "set task.fields.answer" in err, err
    good = write_jsonl(tmp_path / "g.jsonl", [{"question": "1 + 1?", "answer": 2}])
    assert (
        check_task(
            Config.model_validate({"task": {"name": "dataset", "path": str(good), "fields": {"prompt": "question"}}})
        )
        is None
    )
    gsm = write_jsonl(tmp_path / "gsm.jsonl", [{"question": "1 + 1?", "answer": "2"}])
    problem = check_task(Config.model_validate({"task": {"name": "gsm8k", "path": str(gsm)}}))
    assert "'#### 42'" in problem and "set task.answer_format=raw" in problem  # issue 43: the way out is named
    raw = {"task": {"name": "gsm8k", "path": str(gsm), "answer_format": "raw"}}
    assert check_task(Config.model_validate(raw)) is None  # and it works


def test_preflight_checks_the_eval_task_too(tmp_path):
    good = str(write_jsonl(tmp_path / "d.jsonl", RECORDS))
    cfg = Config.model_validate(
        {
            "task": {**TASK, "path": good},
            "eval": {"every_steps": 5, "task": {**TASK, "path": str(tmp_path / "test.jsonl")}},
        }
    )
    assert "eval.task.path=" in check_task(cfg) and "set eval.task.path" in check_task(cfg)
    cfg.eval.every_steps = None  # eval off: its task is not read
    assert check_task(cfg) is None
