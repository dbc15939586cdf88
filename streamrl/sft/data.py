"""SFT data: rows from jsonl, parquet or Hugging Face `datasets`, tokenized into (ids, loss mask).

    train, held_out = load_splits(cfg.sft, cfg.task, seed=cfg.run.seed, max_tokens=cfg.generator.max_tokens)   # row sources (len, [i])
    sample = tokenize_row(tokenizer, row, cfg.sft)    # Sample(ids, mask): mask[t] = 1 -> token t is trained

A row is either chat `messages` (OpenAI format, optional `tools`), rendered with the tokenizer's
chat template, with the loss on the assistant turns (all, or only the last: sft.assistant_turns),
or a prompt/completion pair, tokenized as the RL feeder tokenizes prompts (no special tokens
added) with the completion and EOS trained. Assistant spans are found by rendering the
conversation up to each assistant turn (with and without the generation prompt) and mapping
those character offsets onto the tokens, so any template works that renders earlier turns the
same way whatever follows them; one that does not is reported per row.
A row that cannot be used is a `SampleError` (the caller counts and skips it: bad data never
stops a run); a source that cannot be read is a `ConfigError`.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from streamrl.config.schema import SFTConfig, TaskConfig
from streamrl.core.errors import ConfigError, StreamRLError
from streamrl.tasks.charclass import CHAR_CLASSES, charclass_items


class SampleError(StreamRLError, ValueError):
    """One row cannot be trained on (the message says why); it is skipped and counted."""


@dataclass
class Sample:
    ids: np.ndarray
    """Token ids, int64."""
    mask: np.ndarray
    """1 where the token is a training target (predicted from the tokens before it), float32."""
    truncated: bool = False

    @property
    def loss_tokens(self) -> int:
        return int(self.mask[1:].sum())


def charclass_demos(n: int, length: int, seed: int) -> list[dict]:
    """`n` prompt/completion demonstrations of the charclass task: `length` characters of the class."""
    rng = random.Random(seed + 1)
    return [
        {
            "prompt": item["text"],
            "completion": "".join(rng.choice(CHAR_CLASSES[item["meta"]["cls"]]) for _ in range(length)),
        }
        for item in charclass_items(n, length, seed)
    ]


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ConfigError(
                    f"{path}:{lineno}: not valid JSON ({exc.msg}); each line must be one JSON object"
                ) from None
    return rows


def _load_datasets(sft: SFTConfig, split: str):
    try:
        import datasets
    except ImportError as exc:
        raise ConfigError(
            f"sft.data={sft.data!r} needs the `datasets` package ({exc}); pip install datasets, "
            "or point sft.data at a .jsonl or .parquet file"
        ) from exc
    path = Path(sft.data).expanduser()
    if path.is_dir() and ((path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()):
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise ConfigError(
                    f"{path} has splits {sorted(loaded)}, not {split!r}; set sft.data_split / sft.eval_split"
                )
            return loaded[split]
        return loaded
    try:
        return datasets.load_dataset(sft.data, sft.data_name, split=split, data_files=sft.data_files)
    except Exception as exc:  # the library raises many types; all mean the same to the user
        raise ConfigError(
            f"datasets.load_dataset({sft.data!r}, name={sft.data_name!r}, split={split!r}) failed: "
            f"{type(exc).__name__}: {exc}; check sft.data, sft.data_name, sft.data_split, sft.data_files"
        ) from exc


def load_rows(sft: SFTConfig, task: TaskConfig, seed: int, split: str, max_tokens: int | None = None):
    """All rows of one split: a list of dicts or a `datasets.Dataset` (both: len() and [i] -> dict).
    `max_tokens` (generator.max_tokens) is the charclass length when task.charclass_length is unset."""
    if sft.data == "charclass":
        return charclass_demos(sft.num_demos, task.charclass_chars(max_tokens), seed)
    path = Path(sft.data).expanduser()
    if path.suffix == ".jsonl" or path.suffix == ".parquet":
        if not path.is_file():
            raise ConfigError(f"sft.data={sft.data!r} does not exist; point it at a .jsonl/.parquet file")
        if path.suffix == ".jsonl":
            return _read_jsonl(path)
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    return _load_datasets(sft, split)


def load_splits(sft: SFTConfig, task: TaskConfig, seed: int, max_tokens: int | None = None):
    """(train rows, held-out rows): eval_split if set, else eval_fraction of the rows held out (seeded)."""
    if sft.eval_split is not None and (sft.data == "charclass" or Path(sft.data).suffix in (".jsonl", ".parquet")):
        raise ConfigError(
            f"sft.eval_split={sft.eval_split!r} needs a `datasets` source with splits; for a file "
            "unset sft.eval_split and use sft.eval_fraction"
        )
    rows = load_rows(sft, task, seed, sft.data_split, max_tokens)
    if len(rows) == 0:
        raise ConfigError(f"sft.data={sft.data!r} (split {sft.data_split!r}) holds no rows")
    if sft.eval_split is not None:
        return rows, load_rows(sft, task, seed, sft.eval_split, max_tokens)
    n_eval = int(round(len(rows) * sft.eval_fraction))
    if n_eval == 0:
        return rows, []
    if n_eval >= len(rows):
        raise ConfigError(f"sft.eval_fraction={sft.eval_fraction} leaves no training rows of {len(rows)}; lower it")
    order = np.random.default_rng(seed).permutation(len(rows))
    held = set(order[:n_eval].tolist())
    return Subset(rows, [i for i in range(len(rows)) if i not in held]), Subset(rows, order[:n_eval].tolist())


class Subset:
    """Rows `indices` of `rows`, indexable like a list."""

    def __init__(self, rows, indices: list[int]):
        self.rows, self.indices = rows, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict:
        return self.rows[int(self.indices[i])]


def _clean_messages(messages: Any) -> list[dict]:
    if isinstance(messages, str):
        messages = json.loads(messages)
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise SampleError("`messages` must be a list of {role, content} objects (OpenAI format)")
    # Columnar sources (parquet, datasets) give every message every key, None where absent; templates
    # test `is defined`, so absent keys must stay absent.
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


def _render(tokenizer, messages: list[dict], tools, generation_prompt: bool) -> str:
    try:
        return tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt
        )
    except Exception as exc:  # jinja errors, raise_exception() in the template, missing keys: all one bad row
        raise SampleError(f"the chat template failed on this conversation ({type(exc).__name__}: {exc})") from exc


def chat_sample(tokenizer, messages: list[dict], tools, turns: str) -> Sample:
    """Render `messages` with the chat template; mask = the tokens of the assistant turns chosen."""
    if not getattr(tokenizer, "chat_template", None):
        raise SampleError(
            "the tokenizer has no chat template, so `messages` rows cannot be rendered; give the model "
            "folder a chat_template (tokenizer_config.json; the built tiny model: model.tiny.chat_template=true) "
            "or use prompt/completion rows"
        )
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not assistant:
        raise SampleError("the conversation has no assistant message, so nothing would be trained")
    text = _render(tokenizer, messages, tools, False)
    spans = []
    for i in assistant if turns == "all" else assistant[-1:]:
        before = _render(tokenizer, messages[:i], tools, True)
        upto = _render(tokenizer, messages[: i + 1], tools, False)
        if not (text.startswith(upto) and upto.startswith(before)):
            raise SampleError(
                f"the chat template renders the turns before assistant message {i} differently once "
                "later turns follow, so its tokens cannot be located; set sft.assistant_turns=last "
                "or use a template that renders history the same way"
            )
        spans.append((len(before), len(upto)))
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(enc["input_ids"], dtype=np.int64)
    starts = np.asarray([s for s, _ in enc["offset_mapping"]], dtype=np.int64)
    mask = np.zeros(len(ids), dtype=np.float32)
    for a, b in spans:
        mask[(starts >= a) & (starts < b)] = 1.0
    return Sample(ids, mask)


def pair_sample(tokenizer, prompt: str, completion: str) -> Sample:
    """Prompt tokens (as the RL feeder makes them) + completion tokens + EOS; loss on completion + EOS."""
    p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    c = tokenizer(completion, add_special_tokens=False)["input_ids"]
    if tokenizer.eos_token_id is not None:
        c = c + [tokenizer.eos_token_id]
    if not p:
        if tokenizer.bos_token_id is None:
            raise SampleError(
                "empty prompt and no BOS token: the first completion token has no position to be predicted from"
            )
        p = [tokenizer.bos_token_id]
    ids = np.asarray(p + c, dtype=np.int64)
    mask = np.zeros(len(ids), dtype=np.float32)
    mask[len(p) :] = 1.0
    return Sample(ids, mask)


def tokenize_row(tokenizer, row: dict, sft: SFTConfig) -> Sample:
    """The row's Sample, cut to sft.max_seq_len; SampleError if it has no usable loss token."""
    if not isinstance(row, dict):
        raise SampleError(f"a row must be an object, got {type(row).__name__}")
    if row.get(sft.messages_field) is not None:
        tools = row.get(sft.tools_field)
        if isinstance(tools, str):
            tools = json.loads(tools)
        sample = chat_sample(tokenizer, _clean_messages(row[sft.messages_field]), tools or None, sft.assistant_turns)
    elif isinstance(row.get(sft.prompt_field), str) and isinstance(row.get(sft.completion_field), str):
        sample = pair_sample(tokenizer, row[sft.prompt_field], row[sft.completion_field])
    else:
        raise SampleError(
            f"row has neither `{sft.messages_field}` nor string `{sft.prompt_field}` and "
            f"`{sft.completion_field}` (keys: {sorted(row)[:8]}); set sft.messages_field or "
            "sft.prompt_field/sft.completion_field to the dataset's column names"
        )
    if len(sample.ids) > sft.max_seq_len:
        sample = Sample(sample.ids[: sft.max_seq_len], sample.mask[: sft.max_seq_len], truncated=True)
    if sample.loss_tokens == 0:
        raise SampleError(
            "no loss token left (after truncation to sft.max_seq_len)"
            if sample.truncated
            else "no loss token (the assistant turns render to nothing)"
        )
    return sample


def step_indices(n_rows: int, step: int, batch_size: int, seed: int) -> list[int]:
    """Row indices of optimizer step `step` (0-based): a seeded permutation per epoch, read in order,
    so the data position is a pure function of the step (resume needs nothing else)."""
    out = []
    for pos in range(step * batch_size, (step + 1) * batch_size):
        epoch, k = divmod(pos, n_rows)
        out.append(int(_permutation(n_rows, seed, epoch)[k]))
    return out


_PERMS: dict[tuple[int, int, int], np.ndarray] = {}


def _permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    key = (n, seed, epoch)
    if key not in _PERMS:
        if len(_PERMS) > 4:
            _PERMS.clear()
        _PERMS[key] = np.random.default_rng([seed, epoch]).permutation(n)
    return _PERMS[key]
