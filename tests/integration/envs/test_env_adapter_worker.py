"""A TextArena game, unchanged, behind real env workers on a real redis-server: its first
observation is the episode's prompt, moves are answered through the stream protocol, and a turn
that lands on a worker which never saw the game is replayed there to the same board."""

from pathlib import Path

import pytest

from streamrl.config.schema import Config
from streamrl.core.messages import StepRequest, encode
from tests.integration.envs.test_env_worker import burst, env_config, observations
from workers.env import EnvWorker
from workers.feeder import load_items

pytest.importorskip("textarena", reason="pip install -e '.[envs]'")
pytestmark = pytest.mark.anyio
GAME = "textarena:2048-v0"  # every move spawns a random tile: a replay that drifted would show


def request(item: dict, actions: list[str], episode: str = "g0:0:a") -> StepRequest:
    return StepRequest(
        episode_id=episode,
        group_id=episode.split(":")[0],
        sample=0,
        turn=len(actions) - 1,
        item=item,
        actions=actions,
        reply_to="gen-0",
    )


async def test_game_steps_through_workers_and_replays_on_another(config, broker):
    cfg = env_config(config, GAME)
    task_cfg = Config.model_validate({"task": {"name": "env", "num_prompts": 1}, "env": {"fn": GAME}})
    (item,) = load_items(task_cfg.task, 5, task_cfg)
    assert "2048" in item["text"] and item["meta"]["seed"] == 5
    moves = ["[w]", "[a]", "[s]"]
    a, b, c = (EnvWorker(cfg, broker, f"env-{n}") for n in "abc")
    for w in (a, b, c):
        await w.start()
    for n in (1, 2):  # turns 0 and 1 on worker a
        await broker.add(a.keys.env_steps, encode(request(item, moves[:n])))
        await burst(a)
    await broker.add(b.keys.env_steps, encode(request(item, moves)))  # turn 2 on b: replays 0 and 1
    await burst(b)
    for n in (1, 2, 3):  # the same game from scratch on c, for comparison
        await broker.add(c.keys.env_steps, encode(request(item, moves[:n], episode="g1:0:a")))
        await burst(c)
    obs = await observations(broker, a.keys, 6)
    mine = [o for o in obs if o.episode_id == "g0:0:a"]
    fresh = [o for o in obs if o.episode_id == "g1:0:a"]
    assert [o.env_worker for o in mine] == ["env-a", "env-a", "env-b"] and b.stats["replays"] == 1
    assert [o.text for o in mine] == [o.text for o in fresh] and all(o.error == "" for o in mine)
    assert all("[Player]" in o.text and "Score" in o.text for o in mine)


async def test_verifiers_env_steps_through_a_worker_and_another_worker_restarts_it(config, broker, monkeypatch):
    # verifiers' TextArenaEnv runs as one run() coroutine per episode: the worker that started it
    # answers every turn; one that never saw it cannot rebuild the coroutine and says so (replay).
    pytest.importorskip("verifiers", reason="pip install -e '.[envs]'")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[3] / "examples" / "verifiers"))
    spec = "verifiers:vf_textarena_offline?game=Secretary-v0"
    cfg = env_config(config, spec)
    task_cfg = Config.model_validate({"task": {"name": "env", "num_prompts": 1}, "env": {"fn": spec}})
    (item,) = load_items(task_cfg.task, 3, task_cfg)
    a, b = EnvWorker(cfg, broker, "env-a"), EnvWorker(cfg, broker, "env-b")
    for w in (a, b):
        await w.start()
    moves = ["[continue]", "nonsense", "[accept]"]
    for n in (1, 2):
        await broker.add(a.keys.env_steps, encode(request(item, moves[:n])))
        await burst(a)
    await broker.add(b.keys.env_steps, encode(request(item, moves)))
    await burst(b)
    first, second, third = await observations(broker, a.keys, 3)
    assert first.text.startswith("The current value is") and not first.done and first.error == ""
    assert "invalid move" in second.text and not second.done and second.error == ""
    assert third.env_worker == "env-b" and third.error_kind == "replay" and b.stats["replay_refused"] == 1
    await broker.add(a.keys.env_steps, encode(request(item, moves)))  # the worker that has it ends it
    await burst(a)
    last = (await observations(broker, a.keys, 4))[-1]
    assert last.done and last.env_worker == "env-a" and last.error == ""
    import random

    import textarena as ta

    random.seed(3)  # the game as verifiers' TextArenaEnv.run sets it up, played directly
    game = ta.make(env_id="Secretary-v0")
    game.reset(num_players=1)
    for move in moves:
        game.step(move)
    assert game.state.done and last.reward == float(game.state.rewards[0])
