"""Settings can be found and mistakes are blamed where they were made (issue 26, defect 8): an
unknown key gets "did you mean", a bad --set is blamed on the --set, a value YAML reads as a number
gets the hint to quote it, `streamrl config --explain` prints each field's description, and a
reward component is logged under its fn as written."""

from __future__ import annotations

import pytest

from streamrl.config.files import load_config
from streamrl.config.schema import RewardComponent
from streamrl.core.errors import ConfigError
from streamrl.losses import resolve_loss


def _error(overrides: list[str], path=None) -> str:
    with pytest.raises(ConfigError) as exc:
        load_config(path, overrides)
    return str(exc.value)


def test_unknown_keys_get_did_you_mean():
    assert "trainer.stpes: unknown field; did you mean trainer.steps?" in _error(["trainer.stpes=3"])
    assert "did you mean task.fields.answer?" in _error(["task.fields.answr=x"])
    with pytest.raises(ConfigError, match=r"did you mean loss\.eps_high\?"):
        resolve_loss(load_config(None, ["loss.eps_hihg=0.3"]))


def test_a_bad_set_is_blamed_on_the_set_not_the_file(tmp_path):
    err = _error(["trainer.steps=abc"])
    assert err.startswith("invalid --set (applied to ") and "(from --set trainer.steps=abc)" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  stpes: 3\n")
    err = _error([], bad)
    assert err.startswith(f"invalid config ({bad})") and "--set" not in err.split("(`streamrl")[0]


def test_a_name_yaml_reads_as_a_number_gets_the_hint_to_quote_it():
    err = _error(["run.name=0123"])
    assert "YAML reads '0123' as the int 83" in err and """--set 'run.name="0123"'""" in err
    assert load_config(None, ['run.name="0123"']).run.name == "0123"  # the hint works


def test_config_explain_prints_each_field_with_its_description(capsys):
    from streamrl.cli import main

    assert main(["config", "--no-preflight", "--explain", "--set", "loss.name=sapo"]) == 0
    out = capsys.readouterr().out
    assert "  steps: 60  # Optimizer steps of the run" in out  # trainer.steps, with its docstring
    assert "  aggregation: seq_mean  # The paper" in out  # sapo's default, with its own docstring
    assert "  sapo_tau_pos: " in out  # the objective's own fields are listed too
    assert "  chat_template: false  # Build the Qwen-style chat variant" in out


def test_a_reward_component_is_logged_under_its_fn_as_written():
    assert RewardComponent(fn="math").label() == "math"
    assert RewardComponent(fn="my_rewards:score").label() == "my_rewards.score"
    assert RewardComponent(fn="my_rewards:score", name="correct").label() == "correct"
