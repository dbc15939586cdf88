"""`streamrl up --resume RUN --set loss.name=NEW` runs NEW with its own defaults, not the old objective's
resolved values written in RUN_DIR/config.yaml, and says so (issue 42 item 3).

    pytest tests/unit/test_resume_objective.py -q
"""

from __future__ import annotations

from streamrl.config.files import dump_config, load_config
from streamrl.losses import resolve_loss
from streamrl.losses.resume import switch_objective


def resumed(tmp_path, first: list[str], now: list[str]):
    """The run written with `first`, then re-read as `up --resume` does with `now`."""
    path = tmp_path / "config.yaml"
    dump_config(load_config(None, first), path)
    cfg, note = switch_objective(path, load_config(path, now), now)
    return resolve_loss(cfg), note


def test_grpo_to_dapo_takes_dapos_defaults_and_says_so(tmp_path):
    loss, note = resumed(tmp_path, [], ["loss.name=dapo"])
    assert loss.name == "dapo" and loss.eps_high == 0.28 and loss.dynamic_sampling is True
    assert (
        "loss.name grpo -> dapo" in note and "eps_high 0.2 -> 0.28" in note and "dynamic_sampling false -> true" in note
    )


def test_the_users_own_values_are_kept_and_set_wins(tmp_path):
    loss, note = resumed(
        tmp_path,
        ["loss.kl_beta=0.01", "loss.eps_low=0.1", "loss.dual_clip_c=3"],
        ["loss.name=dapo", "loss.eps_high=0.3"],
    )
    assert (loss.kl_beta, loss.eps_low, loss.dual_clip_c, loss.eps_high) == (0.01, 0.1, 3.0, 0.3)
    assert "kept your" in note and "kl_beta=0.01" in note and "from --set: eps_high" in note


def test_settings_the_new_objective_lacks_or_fixes_are_dropped(tmp_path):
    loss, note = resumed(tmp_path, ["loss.name=tis", "loss.tis_cap=3"], ["loss.name=grpo"])
    assert loss.name == "grpo" and "dropped tis_cap=3" in note
    loss, note = resumed(tmp_path, ["loss.name=grpo", "loss.aggregation=seq_mean"], ["loss.name=dr_grpo"])
    assert loss.aggregation == "fixed_horizon" and "dropped aggregation=seq_mean" in note
    loss, note = resumed(tmp_path, ["loss.name=sapo"], ["loss.name=grpo"])
    assert loss.aggregation == "token_mean" and "aggregation seq_mean -> token_mean" in note


def test_the_same_objective_is_left_alone(tmp_path):
    loss, note = resumed(tmp_path, ["loss.name=dapo", "loss.eps_high=0.3"], ["trainer.steps=9"])
    assert note is None and loss.eps_high == 0.3
