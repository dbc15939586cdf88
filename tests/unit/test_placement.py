"""Placement of TP generators and trainer ranks on a host's GPUs (streamrl/launch/placement.py): each
layout that cannot work is refused before anything starts, with the fix named.

    pytest tests/unit/test_placement.py
"""

from __future__ import annotations

import re

import pytest

from streamrl.config.files import load_config
from streamrl.core.errors import ConfigError
from streamrl.generate.vllm_engine import CPU_TP_EXTENSION, cpu_threads_bind, extension_args, parallel_args
from streamrl.launch.placement import describe, head_error, layout, placement_errors

EIGHT = [
    "generator.count=2",
    "generator.tensor_parallel_size=2",
    "trainer.world_size=4",
    "trainer.device=cuda",
    "supervisor.devices={generator: ['0,1', '2,3'], trainer: ['4,5,6,7']}",
]
"""The 8-GPU layout of configs/qwen3-8b-8gpu.yaml: two TP=2 generators and a 4-rank trainer."""


def test_eight_gpu_layout_places_each_process_and_adds_up():
    cfg = load_config(overrides=EIGHT)
    placed = {p.worker_id: p for p in layout(cfg)}
    assert placed["generator-0"].devices == (0, 1) and placed["generator-1"].devices == (2, 3)
    assert placed["trainer-0"].devices == (4, 5, 6, 7) and "ranks 0-3" in placed["trainer-0"].note
    assert placed["reward-0"].devices is None
    assert placement_errors(cfg, host_gpus=8, heads=(32, 8)) == []
    text = describe(cfg, 8)
    assert re.search(r"generator-1\s+2,3\s+vLLM engine, tensor_parallel_size=2", text), text


@pytest.mark.parametrize(
    "sets, host_gpus, heads, fix",
    [
        # devices per role x count > the host's GPUs
        (EIGHT, 4, (32, 8), "this host has 4 (0-3); list GPUs that exist"),
        (["generator.count=3", "generator.tensor_parallel_size=2"], 4, (32, 8), "needs 6 GPUs, but this host has 4"),
        # TP generators started without devices would share every GPU
        (
            ["generator.count=2", "generator.tensor_parallel_size=2"],
            8,
            (32, 8),
            "give each its own in supervisor.devices",
        ),
        # two TP engines given one GPU
        (
            ["generator.count=2", "generator.tensor_parallel_size=2", "supervisor.devices={generator: ['0,1', '1,2']}"],
            8,
            (32, 8),
            "both get GPU(s) [1]: two tensor-parallel engines cannot share",
        ),
        # TP not dividing the heads / KV heads
        (["generator.tensor_parallel_size=3"], 8, (32, 8), "choose one of [1, 2, 4, 8, 16, 32]"),
        (["generator.tensor_parallel_size=4"], 0, (12, 6), "choose one of [1, 2, 3, 6, 12]"),
    ],
)
def test_impossible_layouts_are_refused_with_the_fix(sets, host_gpus, heads, fix):
    errors = placement_errors(load_config(overrides=sets), host_gpus, heads)
    assert any(fix in e for e in errors), errors


@pytest.mark.parametrize(
    "sets, fix",
    [
        (["supervisor.devices={trainer: ['0,0']}"], "lists a GPU twice"),
        (
            ["generator.tensor_parallel_size=2", "supervisor.devices={generator: ['0']}"],
            "list 2 GPUs per generator (e.g. '0,1') or set tensor_parallel_size=1",
        ),
    ],
)
def test_device_entries_that_cannot_work_fail_at_load(sets, fix):
    with pytest.raises(ConfigError, match=re.escape(fix)):
        load_config(overrides=sets)


def test_heads_rule_is_vllms():
    assert head_error(2, 2, 1) is None  # the tiny model: KV head replicated on both workers
    assert head_error(8, 32, 8) is None and head_error(16, 32, 8) is None
    assert "choose one of" in head_error(4, 2, 1)


def test_tp_engine_args_and_cpu_binding():
    assert parallel_args(1) == {}
    assert parallel_args(2) == {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}
    bind = cpu_threads_bind(2).split("|")
    assert len(bind) == 2 and all(bind)


def test_cpu_tp_workers_get_the_all_reduce_extension():
    """A CPU engine of several TP workers loads streamrl/generate/cpu_tp.py in each (gloo all-reduce);
    a weight backend's own extension is kept (cuda_ipc's is GPU-only)."""
    assert extension_args(None, cpu_tp=True) == {"worker_extension_cls": CPU_TP_EXTENSION}
    assert extension_args("pkg.Ext", cpu_tp=True) == {"worker_extension_cls": "pkg.Ext"}
    assert extension_args(None, cpu_tp=False) == {}
