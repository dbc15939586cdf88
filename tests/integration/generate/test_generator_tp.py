"""A generator whose vLLM engine spans two CPU workers (generator.tensor_parallel_size=2), with real
redis, the shm weight backend and the offline tiny model (2 heads, 1 KV head: the KV head replicated).

One subprocess (tests/programs/tp_script.py) starts one TP=2 engine and runs every scenario: a group
on the initial weights, an in-flight switch whose tokens keep exact versions, each TP worker's weights
compared with the published version, then one TP worker SIGKILLed mid-group.

    pytest tests/integration/generate/test_generator_tp.py
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from streamrl.config.schema import TinyModelConfig
from streamrl.models.tiny import build_tiny_model
from tests.engine_script import run_scenarios
from tests.integration.generate.test_generator import PEAK, _peaked

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "tests" / "programs" / "tp_script.py"
MAX_TOKENS, GROUP_SIZE = 200, 4
WHOLE = ("model.embed_tokens.weight", "lm_head.weight")
"""Parameters split by rows across the TP workers (vocab-parallel) and stored whole in vLLM (not fused)."""

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def results(redis_server, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("tp")
    model = build_tiny_model(TinyModelConfig(), tmp / "model", seed=0)
    save_file(_peaked(load_file(str(model / "model.safetensors")), PEAK), str(tmp / "peaked.safetensors"))
    spec = {
        "redis_url": redis_server.url,
        "run": f"tp-{uuid.uuid4().hex[:6]}",
        "run_dir": str(tmp / "run"),
        "model": str(model),
        "peaked": str(tmp / "peaked.safetensors"),
    }
    return run_scenarios(SCRIPT, tmp, spec, timeout=540)


def test_one_generator_owns_an_engine_of_two_workers_that_generates(results):
    assert [rank for rank, _ in results["ranks"]] == [0, 1]
    assert len({pid for _, pid in results["ranks"]}) == 2  # a process per TP worker
    first = results["first"]
    assert [r["sample"] for r in first] == list(range(GROUP_SIZE))
    for r in first:
        assert r["version"] == 0 and r["version_switches"] == []
        assert len(r["completion_ids"]) == len(r["logprobs"]) == MAX_TOKENS
    assert len({tuple(r["completion_ids"]) for r in first}) == GROUP_SIZE
    # Both workers hold the initial weights exactly (each its own shard of them).
    before = results["diff_base_before"]
    assert len(before) == 2 and all(set(WHOLE) <= set(rank) for rank in before), before
    assert all(d == 0.0 for rank in before for d in rank.values()), before


def test_inflight_switch_keeps_exact_versions_per_token(results):
    for r in results["switch"]:
        assert r["version"] == 0 and len(r["version_switches"]) == 1, r["version_switches"]
        idx, got = r["version_switches"][0]
        assert got == 1 and 0 < idx < MAX_TOKENS, (idx, got)
        tail, head = r["completion_ids"][idx:], r["completion_ids"][:idx]
        assert tail == [PEAK] * len(tail)  # every token after the switch came from version 1, on both workers
        assert min(r["logprobs"][idx:]) > -1e-3
        assert head != [PEAK] * len(head)  # and the tokens before it from version 0
    assert results["publish_to_ready_s"] is not None


def test_a_publish_reaches_every_tp_worker(results):
    """After the switch each worker's shard equals its slice of the published file (loading it again
    would change nothing), and differs from the initial weights: rank 1 was not left behind."""
    after, base = results["diff_published_after"], results["diff_base_after"]
    assert len(after) == 2 and all(set(WHOLE) <= set(rank) for rank in after), after
    assert all(d == 0.0 for rank in after for d in rank.values()), after
    # Each rank's own rows of the vocab-parallel embedding and lm_head changed (the peaked embedding is
    # constant, the initial one random): rank 1 was not left on the old version.
    assert all(rank[name] > 0.01 for rank in base for name in WHOLE), base


def test_a_killed_tp_worker_ends_the_generator_and_leaves_its_group_to_another(results):
    """vLLM's executor notices the dead worker, the engine is dead, and the generator's run ends with
    the error (under `streamrl up` it is restarted); the in-flight group's prompt stays un-acked and
    another generator's XAUTOCLAIM takes it whole; nothing of it was published."""
    assert results.get("engine_dead") is True, results["run_ended"]
    assert results["ended_after_kill_s"] < 60
    assert results["pending_after_kill"]["generator"] == 1
    assert results["claimed_groups"] == ["killed"]
    assert results["killed_rollouts"] == 0
    assert results["engine_processes_left"] == []
