"""RUN_DIR/config.yaml means what the user's config means: the loss settings resolved from the
written file equal those the pre-flight resolved, for every objective and every shipped config,
and writing then reading the written file round-trips (issue 26, defect 1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamrl.config.files import dump_config, load_config
from streamrl.losses import resolve_loss
from streamrl.losses.registry import available_losses

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def _written(cfg, tmp_path: Path, name: str = "config.yaml"):
    path = tmp_path / name
    dump_config(cfg, path)
    return path, load_config(path)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
@pytest.mark.parametrize("objective", available_losses())
def test_the_written_config_resolves_as_the_preflight_did(config, objective, tmp_path):
    cfg = load_config(config, [f"loss.name={objective}"])
    want = resolve_loss(cfg)  # what preflight resolves
    path, again = _written(cfg, tmp_path)
    assert resolve_loss(again) == want
    # Written again from what was read, the file is the same: a resume or a rank re-reading it agree.
    path2, _ = _written(again, tmp_path, "again.yaml")
    assert path2.read_text() == path.read_text()
    assert again.model_dump(exclude={"loss"}) == cfg.model_dump(exclude={"loss"})


@pytest.mark.parametrize(
    "objective, field, value",
    [
        ("gspo", "aggregation", "seq_mean"),
        ("dr_grpo", "advantage", "group_mean"),
        ("dr_grpo", "aggregation", "fixed_horizon"),
        ("sapo", "aggregation", "seq_mean"),
        ("dapo", "dynamic_sampling", True),
    ],
)
def test_the_objective_defaults_survive_the_run_directory(objective, field, value, tmp_path):
    _, again = _written(load_config(None, [f"loss.name={objective}"]), tmp_path)
    assert getattr(resolve_loss(again), field) == value


def test_an_unset_horizon_still_follows_max_tokens_after_the_write(tmp_path):
    path, _ = _written(load_config(None, ["loss.name=dr_grpo", "generator.max_tokens=24"]), tmp_path)
    assert resolve_loss(load_config(path, ["generator.max_tokens=40"])).horizon == 40


def test_generator_compile_off_survives_the_run_directory(tmp_path):
    # every role (and a resumed run) starts its engine from the written file: compile must stay off
    _, again = _written(load_config(CONFIGS[0].parent / "qwen3-0.6b-gpu.yaml", ["generator.compile=false"]), tmp_path)
    assert again.generator.compile is False and again.generator.enforce_eager is False
