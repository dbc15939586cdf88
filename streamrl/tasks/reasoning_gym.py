"""reasoning-gym as a task source and its scorers as the reward (task.name=reasoning_gym,
reward.fn=reasoning_gym): procedural items generated offline, each scored by its dataset's own
`score_answer`.

    items = gym_items(cfg.reasoning_gym, seed=cfg.run.seed)   # [{"text", "meta"}, ...]
    r = reasoning_gym_reward(prompt, completion, item["meta"])

An item's meta carries the dataset spec (name, config, size, seed) as JSON and the item's index,
so that a reward worker (or an external producer) rebuilds the very item from the spec, the
generator being deterministic per (seed, index), and scores it with the dataset's scorer, which
may need the item's full metadata (nested structures that the msgpack'd meta does not carry).
meta["answer"] is the reference answer as text, for other rewards and for reading.
"""

from __future__ import annotations

import functools
import json
import re

from streamrl.core.errors import ConfigError


def _spec(cfg, seed: int) -> str:
    return json.dumps(
        {
            "dataset": cfg.dataset,
            "config": cfg.config,
            "size": cfg.size,
            "seed": cfg.seed if cfg.seed is not None else seed,
        },
        sort_keys=True,
    )


@functools.lru_cache(maxsize=16)
def dataset(spec: str):
    """The reasoning-gym dataset of a spec (JSON from `_spec`), built once per process."""
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ConfigError(
            f"task.name=reasoning_gym needs the reasoning-gym package ({exc}); install it with "
            "`pip install -e '.[envs]'` (or `pip install reasoning-gym`)"
        ) from exc
    s = json.loads(spec)
    try:
        return reasoning_gym.create_dataset(s["dataset"], size=s["size"], seed=s["seed"], **s["config"])
    except Exception as exc:  # unknown names raise ValueError; bad config kwargs TypeError or the dataset's own
        from reasoning_gym.factory import DATASETS

        known = s["dataset"] in DATASETS
        raise ConfigError(
            f"reasoning_gym: create_dataset({s['dataset']!r}, config={s['config']}) failed: {type(exc).__name__}: "
            f"{str(exc)[:200]}; "
            + (
                "check reasoning_gym.config against that dataset's config class"
                if known
                else f"set reasoning_gym.dataset to one of {', '.join(sorted(DATASETS)[:12])}, ..."
            )
        ) from None


def gym_items(cfg, seed: int) -> list[dict]:
    """Every item of the configured dataset as a prompt; meta holds what the scorer needs."""
    spec = _spec(cfg, seed)
    data = dataset(spec)
    items = []
    for i in range(len(data)):
        entry = data[i]
        items.append(
            {
                "text": cfg.template.replace("{question}", entry["question"]),
                "meta": {
                    "task": "reasoning_gym",
                    "rg_spec": spec,
                    "rg_index": i,
                    "rg_answer_tag": cfg.answer_tag,
                    "answer": str(entry["answer"]),
                },
            }
        )
    return items


def extract(completion: str, tag: str) -> str:
    """The text inside the last <tag>...</tag> of the completion if there is one, else all of it, stripped."""
    found = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", completion, flags=re.DOTALL)
    return (found[-1] if found else completion).strip()


def reasoning_gym_reward(prompt: str, completion: str, meta: dict) -> float:
    """`reasoning_gym`: the item's dataset's `score_answer(answer, entry)` (0..1, partial credit where
    the dataset gives it)."""
    if "rg_spec" not in meta:
        raise ValueError("rollout has no meta['rg_spec']: reward.fn=reasoning_gym scores task.name=reasoning_gym items")
    data = dataset(meta["rg_spec"])
    entry = data[int(meta["rg_index"])]
    return float(data.score_answer(extract(completion, str(meta.get("rg_answer_tag", "answer"))), entry))
