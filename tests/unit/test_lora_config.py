"""trainer.lora's bad inputs are refused before anything starts, each naming the fix: at config load
(torchtitan backend, generator.max_loras below the staleness bound) and in pre-flight (target
modules the model lacks, a rank past a target's dimension), against the real tiny model's shapes.

    pytest tests/unit/test_lora_config.py
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from streamrl.config.files import load_config
from streamrl.config.schema import Config
from streamrl.config.trainer import LoraConfig
from streamrl.launch.preflight import check_lora, preflight
from streamrl.train.lora import check_targets


def lora_cfg(**lora) -> Config:
    return Config.model_validate({"trainer": {"lora": {"rank": 8, **lora}}})


def test_lora_is_off_by_default_and_checks_pass_when_it_fits():
    assert not Config().trainer.lora.enabled and check_lora(Config()) is None
    assert check_lora(lora_cfg()) is None
    assert check_lora(lora_cfg(rank=32, target_modules=["q_proj", "k_proj", "gate_proj", "down_proj"])) is None


def test_unknown_target_modules_name_the_models_layers():
    msg = check_lora(lora_cfg(target_modules=["q_proj", "query_key_value"]))
    assert "['query_key_value']" in msg and "set trainer.lora.target_modules" in msg
    assert "q_proj" in msg and "down_proj" in msg  # the layers it does have


def test_a_rank_past_a_targets_dimension_names_the_layer_and_the_limit():
    # the tiny model's k_proj maps 64 -> 32 (one KV head of dim 32): rank 33 cannot fit it
    msg = check_lora(lora_cfg(rank=33, target_modules=["q_proj", "k_proj"]))
    assert "trainer.lora.rank=33" in msg and "k_proj" in msg and "rank <= 32" in msg
    assert check_lora(lora_cfg(rank=32, target_modules=["q_proj", "k_proj"])) is None


def test_preflight_reports_the_lora_problem_with_the_others():
    assert any("trainer.lora.target_modules" in e for e in preflight(lora_cfg(target_modules=["nope"])))


def test_check_targets_matches_the_last_name_part_only():
    shapes = {"model.layers.0.attn.q_proj": (16, 16), "model.q_proj_extra": (4, 4)}
    assert check_targets(shapes, LoraConfig(rank=8, target_modules=["q_proj"])) is None
    assert "q_proj_extra" in check_targets(shapes, LoraConfig(rank=8, target_modules=["q_proj_extra"]))
    assert check_targets(shapes, LoraConfig(rank=0, target_modules=["nope"])) is None  # off: nothing to check


def test_torchtitan_backend_refuses_lora_naming_the_fix():
    with pytest.raises(ValidationError, match="trainer.lora needs trainer.backend=hf"):
        Config.model_validate({"trainer": {"backend": "torchtitan", "lora": {"rank": 8}}})
    Config.model_validate({"trainer": {"backend": "torchtitan"}})  # full weights on torchtitan stay fine


@pytest.mark.parametrize(("loras", "ok"), [(None, True), (3, True), (4, True), (2, False)])
def test_max_loras_must_hold_every_version_in_flight(loras, ok):
    raw = {"rollout": {"max_staleness": 2}, "generator": {"max_loras": loras}, "trainer": {"lora": {"rank": 4}}}
    if ok:
        Config.model_validate(raw)
        return
    with pytest.raises(ValidationError, match=r"generator.max_loras=2 .* set generator.max_loras>=3"):
        Config.model_validate(raw)


def test_max_loras_is_ignored_without_lora():
    Config.model_validate({"rollout": {"max_staleness": 2}, "generator": {"max_loras": 1}})


def test_the_tiny_lora_config_loads_and_passes_the_lora_check():
    cfg = load_config("configs/tiny-lora-cpu.yaml")
    assert cfg.trainer.lora.enabled and check_lora(cfg) is None


def test_lora_resolves_the_reference_to_the_trainer_and_starts_no_reference_worker():
    from streamrl.core.trimming import stream_groups
    from streamrl.launch.supervisor import role_counts

    cfg = load_config("configs/tiny-lora-cpu.yaml")
    assert cfg.loss.kl_beta > 0 and cfg.reference_in_trainer()
    assert cfg.reference.source == "trainer" and cfg.reference.count == 0  # what RUN_DIR/config.yaml says
    assert role_counts(cfg)["reference"] == 0
    assert "ref_logprobs" not in cfg.required_annotations()  # the assembler waits for no reference
    assert all("reference" not in groups for groups in stream_groups(cfg).values())
    # the full-weight job keeps its reference worker
    full = load_config("configs/tiny-cpu.yaml", ["loss.kl_beta=0.001"])
    assert full.reference.source == "worker" and role_counts(full)["reference"] == 1
    assert "ref_logprobs" in full.required_annotations()


def test_a_reference_worker_with_lora_is_refused_unless_asked_for_by_source():
    with pytest.raises(ValidationError, match=r"reference.count=2 asks for reference workers.*reference.source=worker"):
        Config.model_validate({"trainer": {"lora": {"rank": 8}}, "reference": {"count": 2}})
    cfg = Config.model_validate({"trainer": {"lora": {"rank": 8}}, "reference": {"count": 2, "source": "worker"}})
    assert not cfg.reference_in_trainer() and cfg.reference.count == 2
    assert Config.model_validate({"trainer": {"lora": {"rank": 8}}, "reference": {"count": 0}}).reference_in_trainer()


def test_the_trainer_as_reference_needs_lora():
    with pytest.raises(ValidationError, match=r"reference.source=trainer .* set trainer.lora.rank > 0"):
        Config.model_validate({"reference": {"source": "trainer"}})


def test_the_written_lora_config_reads_back_the_same(tmp_path):
    from streamrl.config.files import dump_config

    dump_config(load_config("configs/tiny-lora-cpu.yaml"), tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml")
    assert again.reference.source == "trainer" and again.reference.count == 0


def test_the_gpu_lora_config_fits_the_qwen3_1_7b_shape(tmp_path):
    """configs/qwen3-1.7b-lora-gpu.yaml against the model it names (its config.json, no weights):
    every pre-flight check that needs no GPU passes, and the LoRA check really ran on that shape."""
    from streamrl.launch.preflight import CHEAP, check_cuda
    from streamrl.models.shapes import qwen3_config

    qwen3_config("qwen3-1.7b", "bfloat16").save_pretrained(tmp_path)
    cfg = load_config("configs/qwen3-1.7b-lora-gpu.yaml", [f"model.path={tmp_path}"])
    full = load_config("configs/qwen3-1.7b-gpu.yaml")
    assert cfg.trainer.lora.enabled and cfg.trainer.backend == "hf" and cfg.trainer.lora.dropout == 0
    assert cfg.generator.max_loras == cfg.rollout.max_staleness + 1
    assert cfg.weights.backend == full.weights.backend and cfg.model.dtype == full.model.dtype
    assert cfg.reference_in_trainer() and cfg.reference.count == 0
    assert [e for check in CHEAP if check is not check_cuda and (e := check(cfg))] == []
    too_big = cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"lora": LoraConfig(rank=2048)})})
    assert "rank <= 1024" in check_lora(too_big)  # k_proj/v_proj: 2048 -> 1024 (8 KV heads of 128)
