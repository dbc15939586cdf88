"""Env adapters: specs, config errors, and TextArena's real games through the adapter (replayable,
each game's RNG its own, observations as deltas)."""

from __future__ import annotations

import pytest

from streamrl.config.schema import Config
from streamrl.core.errors import ConfigError
from streamrl.envs import adapters as env_adapters
from streamrl.envs.resolve import resolve_env
from workers.feeder import load_items

pytest.importorskip("textarena", reason="pip install -e '.[envs]'")

GAME = "textarena:GuessTheNumber-v0"


def test_spec_parsing_and_config_errors():
    assert env_adapters.split_spec(GAME) == ("textarena", "GuessTheNumber-v0")
    assert env_adapters.split_spec("my_envs:Calculator") is None
    assert env_adapters.split_spec("charclass_dialog") is None
    assert Config.model_validate({"env": {"fn": GAME}}).env.fn == GAME
    with pytest.raises(
        ValueError,
        match="there is no openenv adapter: PyPI openenv-core 0.3 installs beside this stack, but its wheel ships no",
    ):
        Config.model_validate({"env": {"fn": "openenv:echo_env"}})
    with pytest.raises(ValueError, match="task.name=env takes its prompts from an env adapter"):
        Config.model_validate({"task": {"name": "env"}, "env": {"fn": "charclass_dialog"}})


@pytest.mark.parametrize(
    "game, fix",
    [
        ("GuessTheNumbr-v0", "did you mean GuessTheNumber-v0"),
        ("TicTacToe-v0", "runs single-player games"),
        ("Wordle-v0", "needs data that is not installed"),
    ],
)
def test_unusable_games_fail_at_start_with_the_fix(game, fix):
    with pytest.raises(ConfigError, match=fix):
        resolve_env(f"textarena:{game}")


def play(factory, item, moves):
    env = factory()
    env.reset(item)
    return [env.step(m) for m in moves]


def test_prompts_are_the_games_first_observations_and_steps_return_only_new_text():
    cfg = Config.model_validate({"task": {"name": "env", "num_prompts": 3}, "env": {"fn": GAME}})
    items = load_items(cfg.task, 7, cfg)
    assert [i["meta"]["seed"] for i in items] == [7, 8, 9]
    assert all("Guess The Number" in i["text"] for i in items)
    ((obs, _, done),) = play(resolve_env(GAME), items[0], ["[10]"])
    assert obs.startswith("\n[Player] [10]") and "Guess The Number" not in obs
    assert done or "target number is" in obs


def test_games_are_replayable_and_independent_when_interleaved():
    # 2048 spawns tiles from the process-wide `random` on every move: without each game's own RNG
    # state, two games in one worker change each other's boards and a replay differs.
    factory = resolve_env("textarena:2048-v0")
    item0, item1 = {"text": "", "meta": {"seed": 1}}, {"text": "", "meta": {"seed": 2}}
    moves = ["[w]", "[a]", "[s]", "[d]"] * 2
    alone = play(factory, item0, moves)
    a, b = factory(), factory()
    a.reset(item0)
    b.reset(item1)
    together = []
    for m in moves:
        together.append(a.step(m))
        b.step(m)
    assert together == alone
    assert "Score" in alone[0][0]


def test_a_won_game_ends_with_the_games_reward():
    import textarena as ta

    factory = resolve_env(GAME)
    item = {"text": "", "meta": {"seed": 3}}
    probe = ta.make("GuessTheNumber-v0")
    probe.reset(num_players=1, seed=3)
    target = probe.env.game_number  # the number TextArena drew for seed 3
    out = play(factory, item, [f"[{target}]"])
    assert out[-1][1:] == (1.0, True)


def test_items_of_other_tasks_get_a_seed_from_their_prompt():
    factory = resolve_env(GAME)
    item = {"text": "Guess a number", "meta": {}}
    assert play(factory, item, ["[4]", "[9]"]) == play(factory, dict(item), ["[4]", "[9]"])


def test_a_game_ending_without_a_numeric_reward_fails_its_episode_with_the_reason():
    env = resolve_env("textarena:ThreeCardMonte-v0")()
    env.reset({"text": "", "meta": {"seed": 0}})
    with pytest.raises(ValueError, match="ThreeCardMonte-v0 ended with reward .* not a number"):
        for move in ["zz", "zz", "zz"]:
            env.step(move)
