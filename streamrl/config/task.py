"""The training task: the synthetic charclass task, or dataset records mapped to prompts."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from streamrl.config.base import Section

GSM8K_TEMPLATE = "{prompt}\nEnd with the final answer on its own line as '#### <number>'.\nAnswer:"
"""The gsm8k preset's prompt: the question, and the answer format `reward.fn=math` reads."""


class DatasetConfig(Section):
    """Where a `dataset` task's records come from (streamrl/feed/datasets.py): a local .jsonl/.json/.parquet
    file, or anything Hugging Face `datasets.load_dataset` reads (a hub id in the local cache or
    reachable, a folder of data files, a builder such as `json` with data_files)."""

    path: str | None = None
    """File, folder or dataset id (load_dataset's `path`); task.path is the same setting."""
    name: str | None = None
    """The dataset's configuration (load_dataset's `name`, e.g. `main` for openai/gsm8k)."""
    split: str = "train"
    """Split to read (`train`, `test`, `train[:1000]`); ignored for a local .jsonl/.parquet file."""
    data_files: str | list[str] | dict[str, str | list[str]] | None = None
    """load_dataset's `data_files` (e.g. {train: a.parquet, test: b.parquet} with path=parquet)."""
    streaming: bool = False
    """Read records lazily (load_dataset(streaming=True)) instead of preparing the whole dataset;
    only the first task.max_items records are read, so set that too."""
    revision: str | None = None
    """A hub dataset's revision (branch, tag or commit)."""


class TaskFields(Section):
    """Which record fields make a prompt and its reward metadata."""

    prompt: str | None = "prompt"
    """Field with the prompt text (formatted into task.template as {prompt})."""
    messages: str | None = None
    """Field with chat messages ([{role, content}, ...]) rendered with the tokenizer's chat template
    (generation prompt added); when set, `prompt` is not used."""
    answer: str | None = "answer"
    """Field copied into meta["answer"] for the reward (None: no answer, e.g. a judge-only task)."""
    meta: list[str] = []
    """Further fields copied into meta unchanged (str, int, float or bool values only)."""


class TaskConfig(Section):
    name: Literal["charclass", "charclass_dialog", "gsm8k", "dataset", "env", "reasoning_gym"] = "charclass"
    """`charclass`: synthetic, no downloads. `charclass_dialog`: its multi-turn form (the prompt
    does not name the class; the env's first observation does; env.fn=charclass_dialog).
    `dataset`: records from task.dataset mapped by task.fields.
    `gsm8k`: `dataset` preset for GSM8K-style records {question, answer "... #### 42"}.
    `env`: the prompts are env.fn's own first observations (an adapter, docs/environments.md).
    `reasoning_gym`: procedural items of the `reasoning_gym` section (streamrl/tasks/reasoning_gym.py)."""
    path: str | None = None
    """Shorthand for task.dataset.path (a jsonl/parquet file, a folder or a dataset id)."""
    dataset: DatasetConfig = DatasetConfig()
    fields: TaskFields = TaskFields()
    template: str = "{prompt}"
    """Prompt format; {prompt} is the prompt field (gsm8k: GSM8K_TEMPLATE, which asks for a '#### N' line)."""
    chat_template: Literal["auto"] | bool = "auto"
    """Render each prompt with the model's chat template (the prompt as the user message, tools.system
    as the system message, tools.template_kwargs passed to the template, the generation prompt added):
    `auto` does where the tokenizer has a template and the job is single-turn (episodes use it with
    tools.chat=true); `true` always (fails at start without a template); `false`: the raw text.
    `streamrl up` says at start which one the job uses, `streamrl config --explain` too."""
    answer_format: Literal["raw", "gsm8k"] = "raw"
    """`gsm8k`: meta["answer"] is the number after the last '####' (commas removed); `raw`: as is."""
    max_items: int | None = Field(None, ge=1)
    """Read at most this many records (required with dataset.streaming)."""
    num_prompts: int = Field(512, ge=1)
    """Synthetic prompts generated for `charclass` and `env` (the feeder cycles through them)."""
    charclass_length: int | None = Field(None, ge=1)
    """Completion characters the `charclass` reward scores. None: generator.max_tokens (one
    character per token, so the whole completion is scored); see `charclass_chars`."""

    def charclass_chars(self, max_tokens: int | None) -> int:
        """The charclass length: task.charclass_length, or generator.max_tokens when unset."""
        if self.charclass_length is None and max_tokens is None:
            raise ValueError(
                "task.charclass_length is unset, so it follows generator.max_tokens: "
                "pass max_tokens=cfg.generator.max_tokens"
            )
        return self.charclass_length or max_tokens

    @model_validator(mode="before")
    @classmethod
    def _gsm8k_preset(cls, data: Any) -> Any:
        # gsm8k is one use of the dataset loader: its field names, template and answer format,
        # unless set explicitly.
        if isinstance(data, dict) and data.get("name") == "gsm8k":
            fields = {"prompt": "question", "answer": "answer", **(data.get("fields") or {})}
            # The prompt states the answer format reward.fn=math reads (a stated '#### N'; see docs/rewards.md).
            data = {"template": GSM8K_TEMPLATE, "answer_format": "gsm8k", **data, "fields": fields}
        return data

    @model_validator(mode="before")
    @classmethod
    def _path_shorthand(cls, data: Any) -> Any:
        # task.path is task.dataset.path written shorter: merged into the input, so no validator
        # writes the validated config.
        if not isinstance(data, dict) or not data.get("path"):
            return data
        ds = data.get("dataset") or {}
        ds_path = ds.get("path") if isinstance(ds, dict) else getattr(ds, "path", None)
        if ds_path and ds_path != data["path"]:
            raise ValueError(f"task.path={data['path']!r} and task.dataset.path={ds_path!r} differ; set one")
        if not ds_path:
            ds = {**ds, "path": data["path"]} if isinstance(ds, dict) else ds.model_copy(update={"path": data["path"]})
            data = {**data, "dataset": ds}
        return data

    @model_validator(mode="after")
    def _dataset(self) -> "TaskConfig":
        if self.name in ("charclass", "charclass_dialog", "env", "reasoning_gym"):  # synthetic: no records to read
            return self
        if not self.dataset.path:
            raise ValueError(
                f"task.name={self.name} needs records: set task.path=/path/to/train.jsonl "
                "(or a parquet file, a folder, a Hugging Face dataset id)"
            )
        if self.fields.prompt is None and self.fields.messages is None:
            raise ValueError(
                "task.fields: set prompt (a text field) or messages (a chat field); e.g. task.fields.prompt=question"
            )
        if self.dataset.streaming and self.max_items is None:
            raise ValueError("task.dataset.streaming=true reads records lazily; set task.max_items (how many to take)")
        if "{prompt}" not in self.template:
            raise ValueError(
                f"task.template={self.template!r} has no {{prompt}}; e.g. task.template='{{prompt}}\\nAnswer:'"
            )
        return self
