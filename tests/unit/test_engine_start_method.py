"""How the generator asks vLLM to start its EngineCore (generator.engine_start_method)."""

from __future__ import annotations

import pytest

from streamrl.config.schema import GeneratorConfig
from streamrl.generate.engine_start import choose_start_method as _start_method

ENV = "VLLM_WORKER_MULTIPROC_METHOD"


@pytest.fixture(autouse=True)
def no_method_in_env(monkeypatch):
    # setenv first so that monkeypatch restores the variable's original state (absent, usually)
    # after _start_method has written it.
    monkeypatch.setenv(ENV, "placeholder")
    monkeypatch.delenv(ENV)


def test_auto_forks_on_a_gpu_and_marks_it_retryable(monkeypatch):
    import os

    assert _start_method("auto", cpu=False) == "auto-fork"  # a failed forked start is retried with spawn
    assert os.environ[ENV] == "fork"


def test_auto_forks_a_single_threaded_process_on_the_cpu_build():
    import os

    # measured on the tiny model: engine start 5.3-5.6 s forked vs 10-26 s spawned, same tokens
    assert _start_method("auto", cpu=True, threads=1) == "auto-fork"
    assert os.environ[ENV] == "fork"


def test_auto_spawns_on_the_cpu_build_when_other_threads_run():
    import os

    assert _start_method("auto", cpu=True, threads=3) == "spawn"
    assert os.environ[ENV] == "spawn"


@pytest.mark.parametrize("setting", ["fork", "spawn"])
def test_an_explicit_setting_is_used_as_is_and_not_retried(setting):
    import os

    assert _start_method(setting, cpu=False) == setting
    assert os.environ[ENV] == setting


def test_the_environment_wins(monkeypatch):
    import os

    monkeypatch.setenv(ENV, "spawn")
    assert _start_method("fork", cpu=False) == "spawn"
    assert os.environ[ENV] == "spawn"


def test_the_default_is_auto_and_bad_values_are_refused():
    assert GeneratorConfig().engine_start_method == "auto"
    with pytest.raises(ValueError):
        GeneratorConfig(engine_start_method="forkserver")
