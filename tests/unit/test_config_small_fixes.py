"""Small things a newcomer hits (issue 43, item 8): `config --explain SECTION` shows only that section and a
null section's fields with their defaults, a misspelled section given by --set is blamed on the --set, and
a GPU config whose random-weight model is missing is told the command its header gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamrl.cli import main
from streamrl.config.files import load_config
from streamrl.core.errors import ConfigError
from streamrl.launch.preflight import check_model_path

QWEN = Path(__file__).resolve().parents[2] / "configs" / "qwen3-0.6b-gpu.yaml"


def explain(capsys, *args: str) -> str:
    assert main(["config", "--no-preflight", "--explain", *args]) == 0
    return capsys.readouterr().out


def test_explain_filters_sections_and_lists_a_null_sections_fields(capsys):
    out = explain(capsys, "trainer")
    assert out.startswith("trainer:") and "  steps: 60  # Optimizer steps" in out
    assert "\nrollout:" not in out and "\njudge:" not in out
    judge = explain(capsys, "judge", "rollout")
    assert judge.startswith("judge: null  # LLM-judge workers")
    assert "#   count: 1  # Judge worker processes" in judge  # its fields, commented out (judge stays null)
    assert "#     path: null  # A local Hugging Face folder" in judge  # nested sections too
    assert "\nrollout:\n  group_size: 8" in judge
    assert "judge:" in explain(capsys) and "#   key: judge" in explain(
        capsys
    )  # --explain alone: all, judge's fields too


def test_explain_names_a_misspelled_section(capsys):
    assert main(["config", "--no-preflight", "--explain", "trainr"]) != 0
    assert "--explain trainr: no such config section; did you mean trainer?" in capsys.readouterr().err


@pytest.mark.parametrize(
    "override, where",
    [("trainr.steps=3", "trainr: unknown field; did you mean trainer?"), ("trainer.lroa.rank=2", "trainer.lroa:")],
)
def test_a_misspelled_section_in_a_set_is_blamed_on_the_set(override, where):
    with pytest.raises(ConfigError) as exc:
        load_config(None, [override])
    err = str(exc.value)
    assert err.startswith("invalid --set (applied to ") and where in err and f"(from --set {override})" in err


def test_a_missing_random_shape_names_the_command_that_builds_it():
    cfg = load_config(QWEN)
    header = next(line for line in QWEN.read_text().splitlines() if "streamrl.models.shapes" in line)
    problem = check_model_path(cfg)
    assert "is not a directory" in problem and f"`{header.strip('# ').strip()}`" in problem
    other = load_config(None, ["model.path=/nowhere/my-model"])
    assert "streamrl.models.shapes" not in check_model_path(other)  # only for a shape's folder
