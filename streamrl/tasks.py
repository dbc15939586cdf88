"""Tasks: the prompts the feeder admits, each with the metadata its reward needs.

    items = load_task(cfg.task, seed=cfg.run.seed)   # [{"text": prompt, "meta": {...}}, ...]

`charclass` (synthetic, no downloads): the prompt names a character class ("digits:",
"vowels:", "upper:", "lower:") and the reward is the fraction of the first `length`
completion characters that belong to it. A random tiny model scores about 0.18 on average;
a model that learned the task scores 1.0, and only if it writes the full length.

`gsm8k`: a jsonl file, one {"question": str, "answer": str} per line, where the answer ends
with GSM8K's "#### 42" final answer. The prompt is `question + "\\nAnswer:"` (GSM8K_TEMPLATE);
meta["answer"] is the final number as a string with thousands separators removed.

Every meta holds only str/int/float so it travels through msgpack unchanged.
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

from streamrl.config import TaskConfig
from streamrl.errors import ConfigError

CHAR_CLASSES: dict[str, str] = {
    "digits": string.digits,
    "vowels": "aeiouAEIOU",
    "upper": string.ascii_uppercase,
    "lower": string.ascii_lowercase,
}
"""Class name -> the characters that score. The prompt is the name followed by ':'."""

GSM8K_TEMPLATE = "{question}\nAnswer:"
"""Prompt format for gsm8k; the model is expected to end its answer with '#### <number>'."""


def charclass_items(num_prompts: int, length: int, seed: int) -> list[dict]:
    """`num_prompts` prompts cycling through the classes, in a seeded order (balanced)."""
    names = sorted(CHAR_CLASSES)
    items = [
        {
            "text": f"{name}:",
            "meta": {"task": "charclass", "cls": name, "chars": CHAR_CLASSES[name], "length": length},
        }
        for name in (names[i % len(names)] for i in range(num_prompts))
    ]
    random.Random(seed).shuffle(items)
    return items


def charclass_dialog_items(num_prompts: int, length: int, seed: int) -> list[dict]:
    """The multi-turn charclass task: the prompt is only "?"; the env (streamrl.envs.CharclassDialog)
    names the class in its first observation and scores the model's second turn against it."""
    return [{"text": "?", "meta": item["meta"]} for item in charclass_items(num_prompts, length, seed)]


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


def gsm8k_items(path: str | Path) -> list[dict]:
    """Read a GSM8K-style jsonl file; ConfigError names the file and line of any bad record."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"task.path={str(path)!r} does not exist; set task.path to a GSM8K-style jsonl file")
    items = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{where}: not valid JSON ({exc.msg}); each line must be one JSON object") from None
            if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in ("question", "answer")):
                raise ConfigError(f'{where}: expected {{"question": str, "answer": str}}, got {line.strip()[:80]!r}')
            try:
                final = parse_gsm8k_answer(record["answer"])
            except ValueError as exc:
                raise ConfigError(f"{where}: {exc}; GSM8K answers end with e.g. '#### 42'") from None
            items.append(
                {
                    "text": GSM8K_TEMPLATE.format(question=record["question"].strip()),
                    "meta": {"task": "gsm8k", "answer": final},
                }
            )
    if not items:
        raise ConfigError(f"{path} holds no records; add one JSON object per line")
    return items


def load_task(cfg: TaskConfig, seed: int) -> list[dict]:
    """All prompts of the configured task as [{"text": str, "meta": dict}]."""
    if cfg.name == "charclass":
        return charclass_items(cfg.num_prompts, cfg.charclass_length, seed)
    if cfg.name == "charclass_dialog":
        return charclass_dialog_items(cfg.num_prompts, cfg.charclass_length, seed)
    if cfg.name == "gsm8k":
        if not cfg.path:
            raise ConfigError("task.name=gsm8k needs a jsonl file: set task.path=/path/to/train.jsonl")
        return gsm8k_items(cfg.path)
    raise ConfigError(f"unknown task.name={cfg.name!r}; use charclass, charclass_dialog or gsm8k")
