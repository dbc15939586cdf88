"""Task sources: the items of the configured task that the feeder admits, each with the metadata its reward needs.

    items = load_task(cfg.task, seed=cfg.run.seed, max_tokens=cfg.generator.max_tokens)   # [{"text": prompt, "meta": {...}}, ...]

`charclass` and `charclass_dialog` (synthetic, no downloads): streamrl/tasks/charclass.py.
`reasoning_gym`: streamrl/tasks/reasoning_gym.py.

`dataset`: records from a local jsonl/parquet file or Hugging Face `datasets`, mapped to prompts by
task.fields (streamrl/feed/datasets.py). `gsm8k` is its preset for {"question": str, "answer": str}
records whose answer ends with GSM8K's "#### 42": the prompt is the question and a line asking for the
answer as '#### <number>' (GSM8K_TEMPLATE) and meta["answer"] the final number with thousands separators removed.

Every meta holds only str/int/float so it travels through msgpack unchanged.
"""

from __future__ import annotations

from streamrl.config.schema import Config, TaskConfig
from streamrl.config.task import GSM8K_TEMPLATE as TASK_GSM8K_TEMPLATE
from streamrl.core.errors import ConfigError
from streamrl.feed.datasets import dataset_items, parse_gsm8k_answer  # noqa: F401  (parse_gsm8k_answer: re-exported)
from streamrl.tasks import reasoning_gym as gym_tasks
from streamrl.tasks.charclass import charclass_dialog_items, charclass_items

GSM8K_TEMPLATE = TASK_GSM8K_TEMPLATE.replace("{prompt}", "{question}")
"""Prompt format for gsm8k: it asks the model to end with '#### <number>', the line reward.fn=math reads."""


def load_task(
    cfg: TaskConfig, seed: int, tokenizer=None, max_tokens: int | None = None, job: Config | None = None
) -> list[dict]:
    """All prompts of the configured task as [{"text": str, "meta": dict}]. `tokenizer` renders chat
    messages (task.fields.messages); the feeder passes the model's. `max_tokens` (generator.max_tokens)
    is the charclass length when task.charclass_length is unset. `job` (the whole config) is needed
    by `reasoning_gym`, configured outside `task`. `env` is not here: its items are the env's own first
    observations, which the feeder asks the env for (workers/feeder.py, `load_items`)."""
    if cfg.name == "env":
        raise ConfigError(
            "task.name=env: the items are the env's first observations (streamrl.envs.adapters.prompts); "
            "load them with workers.feeder.load_items"
        )
    if cfg.name == "reasoning_gym" and job is None:
        raise ConfigError(f"task.name={cfg.name} is configured outside the task section; pass the job's config")
    if cfg.name == "reasoning_gym":
        return gym_tasks.gym_items(job.reasoning_gym, seed)
    if cfg.name == "charclass":
        return charclass_items(cfg.num_prompts, cfg.charclass_chars(max_tokens), seed)
    if cfg.name == "charclass_dialog":
        return charclass_dialog_items(cfg.num_prompts, cfg.charclass_chars(max_tokens), seed)
    return dataset_items(cfg, tokenizer)
