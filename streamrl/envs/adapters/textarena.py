"""TextArena's single-player games as streamrl envs, unchanged: `env.fn: textarena:<game id>`.

    env.fn: textarena:GuessTheNumber-v0
    task.name: env            # prompts: each game's first observation (seeds run.seed, run.seed+1, ...)
    reward.fn: env            # the game's own reward when it ends (TextArena's close())

The game is `textarena.make(id)` with TextArena's default wrappers, reset with one player and the
item's meta["seed"]. The model's turn is the action as is; an episode ends when the game says
done, and its reward is what `close()` gives player 0. TextArena's observation is the whole game
so far, so each step returns only what the game added since the last one (the history is already
in the episode's tokens); if the game rewrote earlier text, the whole observation is sent.

TextArena games draw from the process-wide `random` module (seeded by reset), so two games in one
worker would disturb each other and a replayed game would differ: every call runs under one lock
with that game's own `random`/`numpy` state swapped in, which makes a game a pure function of its
seed and actions, i.e. replayable on any env worker.
"""

from __future__ import annotations

import difflib
import random
import threading
import zlib

import numpy as np

from streamrl.core.errors import ConfigError
from streamrl.envs.base import Env

_LOCK = threading.Lock()
"""TextArena games share the process-global RNGs; one call at a time (they are cheap Python)."""


def _registry() -> dict:
    from textarena.envs.registration import ENV_REGISTRY

    return ENV_REGISTRY


class TextArenaEnv(Env):
    """One TextArena game per episode."""

    replayable = True

    def __init__(self, game_id: str):
        self.game_id = game_id
        self.game = None
        self.seen = ""
        self.rng: tuple | None = None

    def _call(self, fn, *args, **kwargs):
        """fn(...) with this game's RNG state in the process-global RNGs, saved back afterwards."""
        with _LOCK:
            if self.rng is not None:
                random.setstate(self.rng[0])
                np.random.set_state(self.rng[1])
            try:
                return fn(*args, **kwargs)
            finally:
                self.rng = (random.getstate(), np.random.get_state())

    def _start(self, seed: int) -> str:
        import textarena as ta

        self.game = ta.make(self.game_id)
        self.rng = None
        self._call(self.game.reset, num_players=1, seed=seed)
        self.seen = self._call(self.game.get_observation)[1]
        return self.seen

    def reset(self, item: dict) -> None:
        # task.name=env items carry their game seed; items of other tasks get one from their prompt,
        # so that every worker still rebuilds the same game.
        seed = (item.get("meta") or {}).get("seed")
        self._start(int(seed) if seed is not None else zlib.crc32(item.get("text", "").encode()))

    def _delta(self, observation: str) -> str:
        new = observation[len(self.seen) :] if observation.startswith(self.seen) else observation
        self.seen = observation
        return new

    def step(self, action: str) -> tuple[str, float, bool]:
        done, _info = self._call(self.game.step, action)
        observation = self._delta(self._call(self.game.get_observation)[1])
        if not done:
            return observation, 0.0, False
        rewards, _game_info = self._call(self.game.close)
        reward = (rewards or {}).get(0, 0.0)
        if not isinstance(reward, (int, float)):  # seen: ThreeCardMonte-v0 puts its message there
            raise ValueError(
                f"TextArena game {self.game_id} ended with reward {reward!r:.80} for player 0, "
                "not a number; this game cannot be scored as an env"
            )
        return observation, float(reward), True


def _lookup_reason(exc: LookupError) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip() and not ln.strip().startswith("*")]
    return next((ln for ln in lines if "not found" in ln), lines[0] if lines else repr(exc))


def _probe(game_id: str) -> TextArenaEnv:
    """A game started once at config time, so an unknown id, a game for several players or one that
    needs data this machine lacks fails with its fix before the job starts, not in every episode."""
    if game_id not in _registry():
        close = difflib.get_close_matches(game_id, list(_registry()), n=3)
        raise ConfigError(
            f"env.fn=textarena:{game_id}: TextArena has no game {game_id!r}"
            + (f" (did you mean {', '.join(close)}?)" if close else "")
            + "; `python -c 'import textarena.envs.registration as r; print(sorted(r.ENV_REGISTRY))'` lists them"
        )
    env = TextArenaEnv(game_id)
    try:
        env._start(0)
    except LookupError as exc:  # nltk corpora (Wordle, Hangman, ...) are separate downloads
        raise ConfigError(
            f"env.fn=textarena:{game_id}: the game needs data that is not installed "
            f"({_lookup_reason(exc)}); install it "
            "(e.g. `python -m nltk.downloader words`) or pick a game without data, e.g. "
            "GuessTheNumber-v0, TowerOfHanoi-v0, Minesweeper-v0"
        ) from None
    except Exception as exc:  # a multi-player game rejects num_players=1 with its own error type
        raise ConfigError(
            f"env.fn=textarena:{game_id}: the game does not start as a one-player game "
            f"({type(exc).__name__}: {exc}); the adapter runs single-player games "
            "(the model is player 0), e.g. GuessTheNumber-v0, TowerOfHanoi-v0"
        ) from None
    return env


def make_factory(game_id: str):
    _probe(game_id)
    return lambda: TextArenaEnv(game_id)


def prompts(game_id: str, n: int, seed: int) -> list[dict]:
    env = _probe(game_id)
    items = []
    for i in range(n):
        text = env._start(seed + i)
        items.append({"text": text, "meta": {"task": "env", "env": f"textarena:{game_id}", "seed": seed + i}})
    return items
