"""reasoning-gym as task source and reward: a real reward worker on a real redis-server scores
rollouts of real reasoning-gym items with each item's dataset scorer (rebuilt from the item's
meta alone, as a reward worker on another host would)."""

import pytest

from streamrl.config.schema import Config
from streamrl.core.messages import decode, encode
from streamrl.feed.sources import load_task
from tests.integration.annotate.one_rollout import rollout
from workers.reward import RewardWorker

pytest.importorskip("reasoning_gym", reason="pip install -e '.[envs]'")
pytestmark = pytest.mark.anyio


def gym_config(base, dataset: str, **gym) -> Config:
    data = base.model_dump()
    data.update(
        task={"name": "reasoning_gym"},
        reward={"fn": "reasoning_gym", "count": 1},
        reasoning_gym={"dataset": dataset, "size": 6, **gym},
    )
    return Config.model_validate(data)


@pytest.mark.parametrize("dataset", ["basic_arithmetic", "spell_backward"])
async def test_reward_worker_scores_real_items_with_their_scorer(config, broker, dataset):
    cfg = gym_config(config, dataset)
    items = load_task(cfg.task, cfg.run.seed, job=cfg)
    assert len(items) == 6 and all(i["text"].endswith("\nAnswer:") for i in items)
    completions = []
    for i, item in enumerate(items):  # right, right inside <answer>, wrong: two of each
        answer = item["meta"]["answer"]
        completions.append([f" {answer}", f"let me think <answer>{answer}</answer>", " no idea"][i % 3])
    worker = RewardWorker(cfg, broker, "reward-0")
    await worker.start()
    for i, (item, text) in enumerate(zip(items, completions)):
        await broker.add(
            worker.keys.rollouts,
            encode(rollout(i, text, item["text"], item["meta"])),
        )
    while await worker.step():
        pass
    out = {a.rollout_id: a for a in (decode(e.data) for e in await broker.read(worker.keys.annotations))}
    assert [out[f"g{i}:0"].error for i in range(6)] == [""] * 6
    assert [out[f"g{i}:0"].value for i in range(6)] == [1.0, 1.0, 0.0, 1.0, 1.0, 0.0]


def test_a_bad_dataset_name_or_config_fails_with_the_fix(config):
    from streamrl.core.errors import ConfigError

    with pytest.raises(ConfigError, match="set reasoning_gym.dataset to one of"):
        cfg = gym_config(config, "no_such_dataset")
        load_task(cfg.task, 0, job=cfg)
    with pytest.raises(ConfigError, match="check reasoning_gym.config"):
        cfg = gym_config(config, "basic_arithmetic", config={"no_such_field": 1})
        load_task(cfg.task, 0, job=cfg)
