"""The generator role with a real vLLM CPU engine, real redis and the offline tiny model.

One subprocess (tests/programs/gen_script.py) starts one engine and runs every scenario; the
tests below assert on its JSON results and recompute log-probs with transformers.

    pytest tests/integration/generate/test_generator.py
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from streamrl.config.schema import TinyModelConfig
from streamrl.core.messages import parse_rollout_id
from streamrl.models.tiny import build_tiny_model, vocab
from tests.engine_script import run_scenarios

SCRIPT = Path(__file__).resolve().parents[2] / "programs" / "gen_script.py"
MAX_TOKENS, TEMPERATURE, GROUP_SIZE = 200, 0.7, 4
PEAK = vocab()["b"]
"""The token the `peaked` weights (version 3) emit with probability ~1."""


def _perturbed(base: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A different but ordinary model: every matrix moved by noise larger than its init scale."""
    g = torch.Generator().manual_seed(2)
    return {k: (t + 0.05 * torch.randn(t.shape, generator=g)) if t.dim() == 2 else t.clone() for k, t in base.items()}


def _peaked(base: dict[str, torch.Tensor], token: int) -> dict[str, torch.Tensor]:
    """Weights whose every next-token distribution puts ~all mass on `token`, whatever the context.

    Constant embeddings and zeroed attention/MLP outputs make the final hidden state the same
    vector everywhere; lm_head then scores only `token`.
    """
    out = {k: t.clone() for k, t in base.items()}
    for k, t in out.items():
        if k.endswith(("o_proj.weight", "down_proj.weight")):
            t.zero_()
    out["model.embed_tokens.weight"].fill_(1.0)
    out["model.norm.weight"].fill_(1.0)
    out["lm_head.weight"].zero_()
    out["lm_head.weight"][token].fill_(0.2)
    return out


@pytest.fixture(scope="module")
def results(redis_server, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("gen")
    model = build_tiny_model(TinyModelConfig(), tmp / "model", seed=0)
    base = load_file(str(model / "model.safetensors"))
    save_file(_perturbed(base), str(tmp / "perturbed.safetensors"))
    save_file(_peaked(base, PEAK), str(tmp / "peaked.safetensors"))
    spec = {
        "redis_url": redis_server.url,
        "run": f"gen-{uuid.uuid4().hex[:6]}",
        "run_dir": str(tmp / "run"),
        "model": str(model),
        "perturbed": str(tmp / "perturbed.safetensors"),
        "peaked": str(tmp / "peaked.safetensors"),
    }
    out = run_scenarios(SCRIPT, tmp, spec, timeout=300)
    out["_model"], out["_tmp"] = str(model), tmp
    return out


def _hf_logprobs(model_dir: str, weights: Path, rollout: dict) -> torch.Tensor:
    """Log-probs of the completion tokens under `weights` at the sampling temperature."""
    from transformers import LlamaForCausalLM

    torch.set_num_threads(1)
    m = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    m.load_state_dict(load_file(str(weights)))
    ids = torch.tensor([rollout["prompt_ids"] + rollout["completion_ids"]])
    with torch.no_grad():
        logits = m(ids).logits[0, len(rollout["prompt_ids"]) - 1 : -1] / TEMPERATURE
    lp = torch.log_softmax(logits.float(), dim=-1)
    return lp.gather(1, torch.tensor(rollout["completion_ids"])[:, None])[:, 0]


def test_late_joiner_generates_with_newest_version(results):
    """Also: the newest version's files were gone at the joiner's first fetch (collected, as a resumed
    trainer's gc does); it read the newest again instead of failing its start (it failed in CI's fault
    test, and the supervisor restarted the generator: ~20 s of engine start)."""
    assert results["join_fetch_failed"] >= 1
    late = results["late"]
    assert [r["sample"] for r in late] == list(range(GROUP_SIZE))
    for r in late:
        assert parse_rollout_id(r["rollout_id"]) == ("late", r["sample"]) and r["worker"] == "gen-0"
        assert r["version"] == 2 and r["version_switches"] == []
        assert len(r["completion_ids"]) == len(r["logprobs"]) == MAX_TOKENS
        assert r["finish_reason"] == "length" and r["prompt_text"] == "abc" and isinstance(r["text"], str)
    assert results["vllm_envs_cached"]  # no os.getenv per request and step in vLLM's output handler
    # Seeds differ per sample, so the group is not four copies of one completion.
    assert len({tuple(r["completion_ids"]) for r in late}) == GROUP_SIZE


def test_logprobs_are_the_sampling_distribution_of_the_loaded_weights(results):
    tmp = results["_tmp"]
    r = results["late"][0]
    expected = _hf_logprobs(results["_model"], tmp / "perturbed.safetensors", r)
    got = torch.tensor(r["logprobs"])
    assert torch.allclose(got, expected, atol=2e-3), (got - expected).abs().max()
    # ...and not those of the initial model: version 2 really was loaded before the first request.
    base = load_file(str(Path(results["_model"]) / "model.safetensors"))
    save_file(base, str(tmp / "base.safetensors"))
    assert (got - _hf_logprobs(results["_model"], tmp / "base.safetensors", r)).abs().mean() > 0.05


@pytest.mark.parametrize("group,old,new", [("switch", 2, 3), ("switch_delta", 4, 5)])
def test_inflight_switch_records_the_token_where_weights_changed(results, group, old, new):
    """`switch`: one output per request (generator.stream_interval 0), so the index comes from the
    engine's token count at the pause; `switch_delta`: a delta per token."""
    tmp = results["_tmp"]
    for r in results[group]:
        assert r["version"] == old
        assert len(r["version_switches"]) == 1, r["version_switches"]
        idx, got = r["version_switches"][0]
        assert got == new and 0 < idx < MAX_TOKENS, (idx, got)
        tail, head = r["completion_ids"][idx:], r["completion_ids"][:idx]
        assert tail == [PEAK] * len(tail)  # every token after the switch came from version 3
        assert min(r["logprobs"][idx:]) > -1e-3
        # Every token before it came from version 2: its log-probs match version 2 exactly, so
        # no version-3 token was attributed to the old version.
        expected = _hf_logprobs(results["_model"], tmp / "perturbed.safetensors", r)[:idx]
        assert torch.allclose(torch.tensor(r["logprobs"][:idx]), expected, atol=2e-3)
        assert head != [PEAK] * len(head)
    assert results["switch_stats"]["last_switch_latency_s"] < 5.0


def test_held_back_tokens_arrive_once_per_request(results):
    # stream_interval 0: the consumer woke once per request, yet the switch fell mid-request.
    assert results["switch_deliveries"] == GROUP_SIZE
    assert results["switch_made_at_publish"] >= 4 * GROUP_SIZE
    # stream_interval 1: a delta per token, except where vLLM merged those a busy consumer had not taken yet.
    assert 10 * GROUP_SIZE < results["switch_delta_deliveries"] <= GROUP_SIZE * MAX_TOKENS


def test_group_waits_for_its_admitted_version(results):
    assert results["gate_before_publish"] == 0
    for r in results["gate"]:
        assert r["version"] == 4 and r["version_switches"] == []
        assert r["finished_at"] > results["gate_published_at"]


def test_old_versions_are_collected(results):
    assert results["versions_on_disk"] == [4, 5]  # weights.keep=2


def test_rejected_prompt_is_dead_lettered(results):
    (record,) = results["deadletter"]
    assert "vLLM rejected the prompt" in json.loads(record)["reason"]
    groups = ("late", "switch", "gate", "switch_delta")
    assert results["rollouts_per_group"] == dict.fromkeys(groups, GROUP_SIZE)


def test_stop_aborts_what_cannot_finish_and_cleans_up(results):
    assert results["pending_after_stop"] == {"generator": 1}  # only the group that never started
    assert results["heartbeat_after_stop"] is None
    stats = results["stats"]
    assert stats["groups_aborted"] == 1 and stats["groups_done"] == 4 and stats["groups_rejected"] == 1
    assert stats["weight_switches"] == 4  # 2 at start, then 3, 4 and 5 while running
    assert stats["tokens_generated"] == 4 * GROUP_SIZE * MAX_TOKENS
    assert 0 < stats["busy_fraction"] <= 1
    assert not results["fetched_dir_left"]


def test_loop_profile_is_written_at_stop(results):
    from streamrl.generate.loop_profile import read_profile

    stats = results["stats"]
    assert stats["loop_profile_samples"] > 100  # generator.loop_profile_s=0.005 over a run of seconds
    assert 0 <= stats["loop_profile_blocked_samples"] <= stats["loop_profile_samples"]
    assert len(stats["loop_profile_top_blocked"]) <= 5
    stacks = read_profile(results["_tmp"] / "run" / "logs" / "gen-0.loop_profile.txt")
    assert sum(stacks["all"].values()) >= stats["loop_profile_samples"]
    # The worker's own callbacks were sampled (its start-up gc.collect alone holds the loop a while).
    assert any("events.py:Handle._run;worker.py:Worker.run" in stack for stack in stacks["all"])
