"""Torch threads per role process on a CPU host (streamrl/launch/cpu_threads.py, supervisor.cpu_threads):
the cores shared among the computing processes, at least one each; the config or the environment wins."""

from __future__ import annotations

import pytest

from streamrl.config.schema import Config
from streamrl.launch.cpu_threads import computing_processes, threads_per_role
from streamrl.launch.supervisor import Supervisor, role_counts


def test_the_cores_are_shared_among_the_computing_processes_only():
    cfg = Config(
        trainer={"world_size": 2},
        generator={"count": 2},
        reward={"count": 3},
        reference={"count": 1},
        loss={"kl_beta": 0.001},
    )
    counts = role_counts(cfg)
    # 2 trainer ranks + 2 generator engines + 1 reference; feeder and reward workers compute nothing in torch
    assert computing_processes(cfg, counts) == 5
    assert threads_per_role(cfg, counts, cores=16, gpu_host=False) == 3
    assert threads_per_role(cfg, counts, cores=2, gpu_host=False) == 1  # never 0
    assert threads_per_role(cfg, counts, cores=16, gpu_host=True) is None  # torch's default on a GPU host


def test_no_reference_process_leaves_its_share_to_the_others():
    cfg = Config(reference={"count": 1}, loss={"kl_beta": 0.0})
    assert role_counts(cfg)["reference"] == 0
    assert threads_per_role(cfg, role_counts(cfg), cores=8, gpu_host=False) == 4  # trainer + generator


def test_the_config_sets_it_everywhere():
    cfg = Config(supervisor={"cpu_threads": 6})
    assert threads_per_role(cfg, role_counts(cfg), cores=2, gpu_host=True) == 6
    with pytest.raises(ValueError, match="cpu_threads"):
        Config(supervisor={"cpu_threads": 0})


def test_roles_get_it_unless_the_environment_already_sets_it(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    sup = Supervisor(Config(supervisor={"cpu_threads": 3}), tmp_path, "redis://127.0.0.1:1/0")
    assert sup.child_env("trainer", "trainer-0")["OMP_NUM_THREADS"] == "3"
    assert sup.child_env("reward", "reward-0")["OMP_NUM_THREADS"] == "3"
    monkeypatch.setenv("OMP_NUM_THREADS", "5")  # the user's own setting is kept
    sup = Supervisor(Config(supervisor={"cpu_threads": 3}), tmp_path, "redis://127.0.0.1:1/0")
    assert sup.child_env("trainer", "trainer-0")["OMP_NUM_THREADS"] == "5"
