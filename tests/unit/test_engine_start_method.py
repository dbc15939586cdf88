"""How the generator asks vLLM to start its EngineCore (generator.engine_start_method)."""

from __future__ import annotations

import pytest

from streamrl.config.schema import GeneratorConfig
from streamrl.generate import engine_start
from streamrl.generate.engine_start import choose_start_method, release_openmp_pool

ENV = "VLLM_WORKER_MULTIPROC_METHOD"


@pytest.fixture(autouse=True)
def no_method_in_env(monkeypatch):
    # setenv first so that monkeypatch restores the variable's original state (absent, usually)
    # after _start_method has written it.
    monkeypatch.setenv(ENV, "placeholder")
    monkeypatch.delenv(ENV)


def test_auto_forks_on_a_gpu_and_marks_it_retryable(monkeypatch):
    import os

    assert choose_start_method("auto", cpu=False) == "auto-fork"  # a failed forked start is retried with spawn
    assert os.environ[ENV] == "fork"


def test_auto_forks_a_single_threaded_process_on_the_cpu_build():
    import os

    # measured on the tiny model: engine start 5.3-5.6 s forked vs 10-26 s spawned, same tokens
    assert choose_start_method("auto", cpu=True, threads=1) == "auto-fork"
    assert os.environ[ENV] == "fork"


def test_auto_spawns_on_the_cpu_build_when_other_threads_run():
    import os

    assert choose_start_method("auto", cpu=True, threads=3) == "spawn"
    assert os.environ[ENV] == "spawn"


@pytest.mark.parametrize("setting", ["fork", "spawn"])
def test_an_explicit_setting_is_used_as_is_and_not_retried(setting):
    import os

    assert choose_start_method(setting, cpu=False) == setting
    assert os.environ[ENV] == setting


def test_the_environment_wins(monkeypatch):
    import os

    monkeypatch.setenv(ENV, "spawn")
    assert choose_start_method("fork", cpu=False) == "spawn"
    assert os.environ[ENV] == "spawn"


def test_the_default_is_auto_and_bad_values_are_refused():
    assert GeneratorConfig().engine_start_method == "auto"
    with pytest.raises(ValueError):
        GeneratorConfig(engine_start_method="forkserver")


def test_auto_spawns_where_a_loaded_libgomp_cannot_release_its_pool(monkeypatch):
    import os

    # a forked child of a thread that ran an OpenMP region would hang in its first one (issue 46)
    monkeypatch.setattr(engine_start, "unreleasable_openmp", lambda: ["/x/libgomp.so.1"])
    assert choose_start_method("auto", cpu=False) == "spawn"
    assert os.environ[ENV] == "spawn"
    assert choose_start_method("fork", cpu=False) == "spawn"  # the environment (set just now) wins


def test_the_calling_threads_openmp_pool_is_released_and_comes_back():
    import os

    import torch

    if not engine_start.openmp_runtimes():
        pytest.skip("no OpenMP runtime loaded by this torch build")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        (torch.ones(4_000_000) * 2).sum()  # a parallel region: the pool's worker thread starts
        assert engine_start.unreleasable_openmp() == []  # torch's libgomp has omp_pause_resource_all
        assert release_openmp_pool() >= 1
        assert release_openmp_pool() == 0  # nothing left to release
        before = len(os.listdir("/proc/self/task"))
        assert float((torch.ones(4_000_000) * 2).sum()) == 8_000_000.0  # the next region starts a new pool
        assert len(os.listdir("/proc/self/task")) > before
    finally:
        torch.set_num_threads(threads)
