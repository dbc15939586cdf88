"""Records of a `dataset` task: local jsonl/parquet files or Hugging Face `datasets`, mapped to prompts.

    items = dataset_items(cfg.task, tokenizer)   # [{"text": prompt, "meta": {"answer": ..., ...}}, ...]

Sources (task.dataset): a local `.jsonl`/`.json` file (one object per line, errors name file:line)
or `.parquet` file, read here directly; anything else goes to `datasets.load_dataset(path, name,
split=..., data_files=..., streaming=..., revision=...)`: a folder of data files, a builder such as
`json`/`parquet` with data_files, or a hub dataset id (from the local cache, or downloaded where
the machine can reach the hub; streamrl itself fetches nothing else). task.fields says which field
is the prompt (formatted into task.template) or the chat messages (rendered with the tokenizer's
chat template), which is the answer (meta["answer"]), and which further fields go into meta.
Every meta value is str/int/float/bool, so it travels through msgpack unchanged.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any, Iterator

from streamrl.config.schema import TaskConfig
from streamrl.core.errors import ConfigError

LOCAL_JSON = (".jsonl", ".json", ".ndjson")


def _jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{where}: not valid JSON ({exc.msg}); each line must be one JSON object") from None


def _parquet(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises its own ArrowInvalid and OSError variants
        raise ConfigError(
            f"{path}: not a readable parquet file ({exc}); check the file or convert it to jsonl"
        ) from None
    row = 0
    for batch in table.iter_batches():
        for record in batch.to_pylist():
            yield f"{path}: row {row}", record
            row += 1


def _hf(task: TaskConfig) -> Iterator[tuple[str, Any]]:
    import datasets

    ds = task.dataset
    shown = f"{ds.path}" + (f" ({ds.name})" if ds.name else "") + f" split {ds.split}"
    try:
        data = datasets.load_dataset(
            ds.path, ds.name, split=ds.split, data_files=ds.data_files, streaming=ds.streaming, revision=ds.revision
        )
    except Exception as exc:  # datasets raises many types (FileNotFoundError, DatasetNotFoundError, ValueError)
        raise ConfigError(
            f"task.dataset: load_dataset({shown}) failed: {type(exc).__name__}: {str(exc)[:300]}; set task.path "
            "to a local jsonl/parquet file or folder, or a dataset id in the local Hugging Face cache "
            "(with task.dataset.name/split as the dataset defines them)"
        ) from None
    for i, record in enumerate(data):
        yield f"{shown}: row {i}", record


def missing_file(task: TaskConfig) -> str | None:
    """The error for a task.path that names a local data file (by its suffix) that is not there."""
    path = Path(task.dataset.path or "").expanduser()
    if task.name != "charclass" and path.suffix in (*LOCAL_JSON, ".parquet") and not path.is_file():
        return (
            f"task.path={task.dataset.path!r} does not exist; set task.path to a jsonl or parquet file "
            "(GSM8K-style for task.name=gsm8k), a folder of data files or a dataset id"
        )
    return None


def records(task: TaskConfig) -> Iterator[tuple[str, Any]]:
    """(where, record) for each record of the task's source, `where` naming it in error messages."""
    if problem := missing_file(task):
        raise ConfigError(problem)
    path = Path(task.dataset.path).expanduser()
    if path.is_file() and path.suffix in LOCAL_JSON:
        return _jsonl(path)
    if path.is_file() and path.suffix == ".parquet":
        return _parquet(path)
    return _hf(task)


def _plain(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool))


def parse_gsm8k_answer(answer: str) -> str:
    """The final number after the last '####', commas removed; ValueError if there is none."""
    if "####" not in answer:
        raise ValueError("answer has no '#### <number>' final answer")
    final = answer.rsplit("####", 1)[1].strip().replace(",", "").rstrip(".")
    try:
        float(final)
    except ValueError:
        raise ValueError(f"final answer {final!r} after '####' is not a number") from None
    return final


def _prompt_text(task: TaskConfig, record: dict, where: str, tokenizer) -> str:
    f = task.fields
    if f.messages is not None:
        messages = record.get(f.messages)
        if not (
            isinstance(messages, list)
            and messages
            and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages
            )
        ):
            raise ConfigError(
                f"{where}: field {f.messages!r} must be chat messages [{{role, content}}, ...]; "
                "check task.fields.messages"
            )
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                "task.fields.messages needs a tokenizer with a chat template, but model.path's has "
                "none; use task.fields.prompt with a text field, or a chat model"
            )
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt = record.get(f.prompt)
    if not isinstance(prompt, str):
        raise ConfigError(
            f"{where}: expected a text field {f.prompt!r}, got fields {sorted(record)[:10]}; "
            "set task.fields.prompt to the prompt's field name"
        )
    return task.template.replace("{prompt}", prompt.strip())


def record_item(task: TaskConfig, record: Any, where: str, tokenizer=None) -> dict:
    """One record -> {"text", "meta"}; ConfigError naming `where` and the fix for a bad record."""
    meta = record_meta(task, record, where)
    return {"text": _prompt_text(task, record, where, tokenizer), "meta": meta}


def record_meta(task: TaskConfig, record: Any, where: str) -> dict:
    """The reward's view of one record (the answer, task.fields.meta); ConfigError naming the fix."""
    if not isinstance(record, dict):
        raise ConfigError(f"{where}: expected an object with fields, got {str(record)[:80]!r}")
    meta: dict[str, Any] = {"task": task.name}
    f = task.fields
    if f.answer is not None:
        answer = record.get(f.answer)
        if not _plain(answer):
            raise ConfigError(
                f"{where}: expected a field {f.answer!r} (str or number) with the answer, got fields "
                f"{sorted(record)[:10]}; set task.fields.answer (or null for no answer)"
            )
        if task.answer_format == "gsm8k":
            try:
                answer = parse_gsm8k_answer(str(answer))
            except ValueError as exc:
                raise ConfigError(
                    f"{where}: {exc}; task.answer_format=gsm8k (the gsm8k preset) reads the number of GSM8K's "
                    "last line, e.g. '#### 42'; for answers that are the final answer as they are "
                    "(e.g. '42'), set task.answer_format=raw"
                ) from None
        meta["answer"] = answer if isinstance(answer, str) else str(answer)
    for key in f.meta:
        if not _plain(record.get(key)):
            raise ConfigError(f"{where}: task.fields.meta lists {key!r}, which is missing or not a str/number/bool")
        meta[key] = record[key]
    return meta


def check_first_records(task: TaskConfig, n: int = 8) -> None:
    """The first `n` records of a local jsonl/parquet file hold every field the task and reward read
    (task.fields.prompt or .messages, .answer in task.answer_format, .meta): the pre-flight's check,
    so a missing column stops `streamrl config`/`up` instead of the feeder after the job started.
    Dataset ids and folders go through load_dataset and are left to the feeder."""
    path = Path(task.dataset.path or "").expanduser()
    if task.name == "charclass" or not (path.is_file() and path.suffix in (*LOCAL_JSON, ".parquet")):
        return
    for where, record in itertools.islice(records(task), n):
        record_meta(task, record, where)
        if task.fields.messages is None:
            _prompt_text(task, record, where, None)
        elif task.fields.messages not in record:
            raise ConfigError(
                f"{where}: expected a chat field {task.fields.messages!r}, got fields {sorted(record)[:10]}; "
                "set task.fields.messages to the conversation's field name"
            )


def dataset_items(task: TaskConfig, tokenizer=None) -> list[dict]:
    """Every item of the task (at most task.max_items); ConfigError if the source holds none."""
    source = records(task)
    if task.max_items is not None:
        source = itertools.islice(source, task.max_items)
    items = [record_item(task, record, where, tokenizer) for where, record in source]
    if not items:
        raise ConfigError(f"task.dataset {task.dataset.path!r} holds no records; add some or point task.path elsewhere")
    return items
