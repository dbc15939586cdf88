"""verifiers' own TextArenaEnv (verifiers.v1.tasksets.textarena), unchanged, through the verifiers
adapter: the env's run() drives the turns, its game answers each model turn (invalid ones too),
and the reward is what the env and the task's scoring record on the trace."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from streamrl.config.schema import Config
from streamrl.core.errors import ConfigError
from streamrl.envs import adapters as env_adapters
from streamrl.envs.resolve import resolve_env
from workers.feeder import load_items

pytest.importorskip("verifiers", reason="pip install -e '.[envs]'")
pytest.importorskip("textarena", reason="pip install -e '.[envs]'")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "verifiers"
SPEC = "verifiers:vf_textarena_offline?game=Secretary-v0"
PLUGGED = SPEC + '&task={"rewards":{"bracketed":{"fn":"tests.programs.vf_rewards:bracketed","weight":0.5}}}'


@pytest.fixture(autouse=True)
def taskset_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


def items(spec: str, n: int, seed: int) -> list[dict]:
    cfg = Config.model_validate({"task": {"name": "env", "num_prompts": n}, "env": {"fn": spec}})
    return load_items(cfg.task, seed, cfg)


def play(spec: str, item: dict, moves: list[str]):
    async def go():
        env = resolve_env(spec)()
        await env.reset(item)
        out = []
        for move in moves:
            out.append(await env.step(move))
            if out[-1][2]:
                break
        return env, out

    return asyncio.run(go())


def secretary_reward(seed: int, moves: list[str]) -> float:
    """The game played directly with TextArena, as verifiers' TextArenaEnv.run sets it up."""
    import textarena as ta

    random.seed(seed)
    game = ta.make(env_id="Secretary-v0")
    game.reset(num_players=1)
    for move in moves:
        game.step(move)
        if game.state.done:
            return float(game.state.rewards[0])
    raise AssertionError("the game did not end")


def test_prompts_are_the_tasksets_tasks_from_the_seed_on():
    from verifiers.v1.tasksets.textarena.taskset import SYSTEM_PROMPT

    got = items(SPEC, 3, 4)
    assert [i["meta"]["idx"] for i in got] == [4, 5, 6]
    assert all(i["text"].startswith(SYSTEM_PROMPT) and "[accept]" in i["text"] for i in got)
    assert got[0]["text"] != got[1]["text"]  # each task its own seeded board


def test_the_envs_run_steps_the_game_and_its_outcome_is_the_reward():
    (item,) = items(SPEC, 1, 2)
    moves = ["[continue]", "[continue]", "[accept]"]
    env, out = play(SPEC, item, moves)
    assert [done for _, _, done in out] == [False, False, True]
    assert all(obs.startswith("The current value is") for obs, _, _ in out[:2])  # verifiers' latest feedback
    assert out[-1][1] == secretary_reward(2, moves) == env.trace.rewards["game_reward"].score
    assert [m.role for m in env.trace.messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
    ]


def test_an_invalid_move_is_answered_by_the_game_and_the_episode_goes_on():
    (item,) = items(SPEC, 1, 0)
    env, out = play(SPEC, item, ["I think I will wait", "still thinking"])
    (obs, reward, done), last = out
    assert not done and "invalid move" in obs and reward == 0.0
    assert last == ("", -1.0, True) == ("", secretary_reward(0, ["x", "x"]), True)
    assert "Invalid Move" in env.trace.info["game_outcome"]


def test_a_reward_plugged_into_the_task_is_scored_and_weighted_with_the_envs():
    (item,) = items(PLUGGED, 1, 2)
    moves = ["[continue]", "[continue] now", "[accept]"]
    env, out = play(PLUGGED, item, moves)
    assert env.trace.rewards["bracketed"].score == pytest.approx(2 / 3)
    assert out[-1][1] == pytest.approx(secretary_reward(2, ["[continue]", "[continue]", "[accept]"]) + 0.5 * 2 / 3)


def test_specs_that_cannot_run_fail_at_start_with_the_fix():
    assert env_adapters.split_spec(SPEC) == ("verifiers", "vf_textarena_offline?game=Secretary-v0")
    with pytest.raises(ConfigError, match="verifiers cannot load this env .*taskset id"):
        resolve_env("verifiers:no_such_taskset")
    with pytest.raises(ConfigError, match="verifiers cannot load this env .taskset.colour: Extra inputs"):
        resolve_env("verifiers:vf_textarena_offline?game=Secretary-v0&colour=red")  # a field the taskset lacks
    box = SPEC + '&task={"rewards":{"box":{"fn":"tests.programs.vf_rewards:needs_a_box"}}}'
    with pytest.raises(ConfigError, match="scoring needs what streamrl does not run .*box"):
        resolve_env(box)


def test_the_agents_turn_limit_from_the_envs_config_ends_the_exchange_unscored():
    # TextArenaEnv stops at a `terminated` segment without recording the game's outcome.
    limited = SPEC + "&env.player.max_turns=2"
    (item,) = items(limited, 1, 2)
    env, out = play(limited, item, ["[continue]", "[continue]", "[continue]"])
    assert [done for _, _, done in out] == [False, True] and out[-1][1] == 0.0
    assert env.trace.num_turns == 2 and "game_reward" in env.trace.rewards and "game_outcome" not in env.trace.info


def test_an_env_that_opens_a_second_agent_run_fails_the_episode_with_the_reason():
    # verifiers' own best-of-n env plays n attempts of one seat at once.
    multi = SPEC + "&env.id=best-of-n&env.n=2"
    (item,) = items(multi, 1, 0)
    with pytest.raises(RuntimeError, match="opens more than one agent run per episode"):
        play(multi, item, ["[accept]"])


def test_a_plain_taskset_runs_in_verifiers_single_agent_env_one_answer_scored_by_the_task():
    # SingleAgentEnv (what a taskset without its own Env gets): the model answers the prompt once
    # and only the task's scoring gives the reward (here the plugged format reward, weight 0.5).
    single = PLUGGED + "&env.id=single-agent"
    (item,) = items(single, 1, 0)
    env, out = play(single, item, ["[accept]", "never sent"])
    assert type(env.env).__name__ == "SingleAgentEnv"
    assert out == [("", 0.5, True)] and list(env.trace.rewards) == ["bracketed"]
