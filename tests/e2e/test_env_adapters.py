"""Other libraries' environments, unchanged, drive a real job: `streamrl up` with
configs/tiny-textarena-cpu.yaml plays TextArena's Secretary-v0 through the adapter
(streamrl/envs/adapters/textarena.py), the prompts being the games' own first observations and the
reward the game's own; configs/tiny-verifiers-cpu.yaml runs verifiers' own TextArenaEnv through
streamrl/envs/adapters/verifiers.py, the reward being what the env records on its trace.

    pytest tests/e2e/test_env_adapters.py
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from bench.jobs import ROOT, log_events, metrics, summary, up, with_pythonpath

pytestmark = pytest.mark.slow
ENV_LIBS = ("textarena", "verifiers")


@pytest.fixture(autouse=True)
def env_libs_installed():
    """The envs extra (installed by `make setup`) is needed: a selected test fails without it, never a
    silent skip; checked here, not at import, so deselecting these tests (`-m gpu`) collects the rest."""
    if missing := [lib for lib in ENV_LIBS if importlib.util.find_spec(lib) is None]:
        pytest.fail(f"{', '.join(missing)} not installed: pip install -e '.[envs]' (or make setup)")


def two_steps(config: str, run_dir: Path, *pythonpath: Path) -> None:
    res = up(
        run_dir, "trainer.steps=2", "run.export=false", config=config, timeout=500, env=with_pythonpath(*pythonpath)
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]


def assert_two_game_steps_trained(run_dir: Path) -> None:
    """Both steps trained 16 episodes each, every one played through the env (more than one turn), the
    accounting exact, and a negative reward: Secretary-v0 scores a game lost by invalid moves -1, which
    is how the untrained tiny model plays it, so a negative reward can only have come from the game."""
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["turns_mean"] > 1 and r["env_tokens"] > 0, r  # the game answered moves, more than once
        assert r["episodes_failed"] == 0, r
    assert min(r["reward_mean"] for r in rows) < 0, rows
    s = summary(run_dir)
    assert s["invariant_holds"] and s["lost"] == 0 and s["double_trained"] == 0
    assert s["episodes"]["trained"] == 2 * 16
    steps = [e for e in log_events(run_dir, "env-0") if e.get("event") == "stopped"]
    assert steps and steps[-1]["steps"] >= 2 * 16, steps


def test_textarena_game_drives_a_job(tmp_path):
    run_dir = tmp_path / "ta"
    two_steps("tiny-textarena-cpu.yaml", run_dir)
    assert_two_game_steps_trained(run_dir)


def test_verifiers_env_drives_a_job(tmp_path):
    # verifiers' TextArenaEnv records the game's outcome on its trace: the reward is the env's own
    run_dir = tmp_path / "vf"
    two_steps("tiny-verifiers-cpu.yaml", run_dir, ROOT / "examples" / "verifiers")
    assert_two_game_steps_trained(run_dir)
