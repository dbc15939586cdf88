"""A verifiers taskset for verifiers' own TextArenaEnv on TextArena's games that need no data.

    PYTHONPATH=examples/verifiers streamrl up --config configs/tiny-verifiers-cpu.yaml
    # env.fn: verifiers:vf_textarena_offline?game=Secretary-v0

verifiers 0.4 ships `verifiers.v1.tasksets.textarena`: an Env (`TextArenaEnv`, the game engine
playing the user, the game's outcome as the reward) and a taskset whose games (Wordle, Hangman,
WordLadder, WordSearch) need NLTK corpora that its `load()` downloads. This module is a verifiers
taskset plugin (a top-level module exporting one Taskset and one Env via `__all__`, the way
verifiers finds tasksets) that pairs that same `TextArenaEnv`, unchanged, with tasks built exactly
like the shipped taskset builds them (verifiers' own `TextArenaTask`/`TextArenaData`, seeded
boards, its system prompt), for any single-player game, so it runs offline.
"""

from __future__ import annotations

import copy
import itertools
import random
from collections.abc import Iterator

import textarena as ta
import verifiers.v1 as vf
from verifiers.v1.tasksets.textarena.taskset import SYSTEM_PROMPT, TextArenaData, TextArenaEnv, TextArenaTask

__all__ = ["OfflineTextArenaTaskset", "TextArenaEnv"]


class OfflineTextArenaConfig(vf.TasksetConfig):
    game: str = "Secretary-v0"
    """A single-player TextArena game that needs no downloaded data."""


class OfflineTextArenaTaskset(vf.Taskset[TextArenaTask, OfflineTextArenaConfig]):
    INFINITE = True

    def load(self) -> Iterator[TextArenaTask]:
        template = ta.make(env_id=self.config.game)

        def observation(seed: int) -> str:
            # As verifiers' TextArenaTaskset: TextArenaEnv.run seeds the global RNG the same way.
            random.seed(seed)
            env = copy.deepcopy(template)
            env.reset(num_players=1)
            return str(env.get_observation()[1])

        for i in itertools.count():
            yield TextArenaTask(
                TextArenaData(
                    name=f"{self.config.game}#{i}",
                    prompt=observation(i),
                    system_prompt=SYSTEM_PROMPT,
                    info={"game": self.config.game, "seed": i},
                ),
                self.config.task,
            )
