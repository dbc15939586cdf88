"""The `reasoning_gym` config section and the cross-section rules of the task sources that
env adapters and reasoning-gym provide (kept out of config.py, which only holds one field each).

    task: {name: reasoning_gym}
    reasoning_gym: {dataset: basic_arithmetic, size: 512, config: {min_terms: 2, max_terms: 2}}
    reward: {fn: reasoning_gym}
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from streamrl.config import env_spec as env_adapters


class ReasoningGymConfig(BaseModel):
    """task.name=reasoning_gym: prompts from one of reasoning-gym's procedural datasets (offline),
    scored by that dataset's own `score_answer` (reward.fn=reasoning_gym)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    dataset: str = "basic_arithmetic"
    """A reasoning-gym dataset name (`reasoning_gym.factory.DATASETS`), e.g. basic_arithmetic,
    chain_sum, letter_counting, spell_backward."""
    config: dict[str, Any] = {}
    """Keyword arguments of that dataset's config (e.g. {min_terms: 2, max_terms: 3}); its
    `size` and `seed` are the fields below."""
    size: int = Field(512, ge=1)
    """Items generated (the feeder cycles through them)."""
    seed: int | None = None
    """The dataset's seed; None: run.seed."""
    template: str = "{question}\nAnswer:"
    """Prompt format; {question} is the item's question."""
    answer_tag: str = "answer"
    """The completion's answer is the text inside <answer_tag>...</answer_tag> when the tag is there
    (reasoning-gym's convention), else the whole completion, stripped."""


def check_task_source(cfg) -> None:
    """ValueError (naming what to set) when task.name, env.fn and reward.fn do not fit together."""
    name = cfg.task.name
    if name == "env" and not (cfg.env.fn and env_adapters.split_spec(cfg.env.fn)):
        raise ValueError(
            f"task.name=env takes its prompts from an env adapter's own games, but env.fn={cfg.env.fn!r} "
            "is not one; set env.fn=textarena:<game id> (docs/environments.md), or another task.name"
        )
    if name == "reasoning_gym" and "{question}" not in cfg.reasoning_gym.template:
        raise ValueError(
            f"reasoning_gym.template={cfg.reasoning_gym.template!r} has no {{question}}; "
            "e.g. reasoning_gym.template='{question}\\nAnswer:'"
        )
    fns = [cfg.reward.fn] if not cfg.reward.components else [c.fn for c in cfg.reward.components]
    if "reasoning_gym" in fns and name != "reasoning_gym":
        raise ValueError(
            f"reward.fn=reasoning_gym scores reasoning-gym items with their dataset's scorer, but "
            f"task.name={name}; set task.name=reasoning_gym or another reward.fn"
        )
