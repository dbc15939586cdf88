"""An objective from the user's own module (`loss.name=package.module:function`), outside the repository.

    pytest tests/unit/test_user_loss.py -q

The module is written into a temporary directory (not importable from the repo) and put on
sys.path, as a user's PYTHONPATH would; the objective must then train through compute_loss like a
built-in, and every mistake (bad syntax, missing module, missing function) must fail naming the fix.
"""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from streamrl.config.schema import Config, LossConfig
from streamrl.core.errors import ConfigError
from streamrl.launch.preflight import check_loss_fn
from streamrl.losses import LossInputs, compute_loss, get_objective, loss_requirements

USER_MODULE = '''
import torch
from streamrl.losses.core import Terms

def scaled_reinforce(cfg, inp):
    """-2 A l: REINFORCE with its gradient doubled, so the test can tell it from any built-in."""
    ratio = torch.exp(inp.logprobs - inp.old_logprobs).detach()
    none = torch.zeros_like(ratio, dtype=torch.bool)
    return Terms(loss=-2.0 * inp.advantages[:, None] * inp.logprobs, ratio=ratio, clip_low=none, clip_high=none)

def needs_prox(cfg, inp):
    assert inp.prox_logprobs is not None
    return scaled_reinforce(cfg, inp)
needs_prox.requires = ("prox_logprobs",)

from pydantic import Field
from streamrl.losses import LossSettings

class WeightedSettings(LossSettings):
    weight: float = Field(2.0, gt=0)

def weighted_reinforce(cfg, inp):
    """-weight A l, the weight one of this objective's own settings."""
    ratio = torch.exp(inp.logprobs - inp.old_logprobs).detach()
    none = torch.zeros_like(ratio, dtype=torch.bool)
    return Terms(loss=-cfg.weight * inp.advantages[:, None] * inp.logprobs, ratio=ratio, clip_low=none,
                 clip_high=none)
weighted_reinforce.settings = WeightedSettings

not_a_function = 3
'''


@pytest.fixture()
def user_pkg(tmp_path, monkeypatch):
    pkg = tmp_path / "my_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "my_loss.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_pkg.my_loss"
    for name in [m for m in sys.modules if m.startswith("my_pkg")]:
        del sys.modules[name]


def test_user_objective_trains_through_compute_loss(user_pkg):
    cfg = LossConfig(name=f"{user_pkg}:scaled_reinforce")
    lp = torch.tensor([[-1.0, -2.0], [-0.5, -0.7]], dtype=torch.float64, requires_grad=True)
    inp = LossInputs(
        lp,
        lp.detach().clone(),
        torch.tensor([1.0, -0.5], dtype=torch.float64),
        torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64),
    )
    loss, metrics = compute_loss(cfg, inp)
    loss.backward()
    # token_mean over 3 real tokens of -2 A l: d/dl = -2 A / 3 on real tokens, 0 on padding
    want = torch.tensor([[-2 / 3, -2 / 3], [1 / 3, 0.0]], dtype=torch.float64)
    assert torch.allclose(lp.grad, want)
    assert loss.item() == pytest.approx(-2 * (1.0 * (-3.0) + -0.5 * (-0.5)) / 3)
    assert metrics["pg_loss"] == pytest.approx(loss.item())


def test_user_objective_declares_the_inputs_it_needs(user_pkg):
    assert loss_requirements(LossConfig(name=f"{user_pkg}:needs_prox")) == {"prox_logprobs"}
    assert get_objective(f"{user_pkg}:scaled_reinforce").requires == frozenset()


def test_config_checks_syntax_only_and_preflight_imports(user_pkg):
    assert Config.model_validate({"loss": {"name": "nowhere_pkg.mod:fn"}}).loss.name == "nowhere_pkg.mod:fn"
    with pytest.raises(ValueError, match="package.module:function"):
        LossConfig(name="my_pkg.my_loss:bad-name")
    assert check_loss_fn(Config.model_validate({"loss": {"name": f"{user_pkg}:scaled_reinforce"}})) is None
    assert "cannot import module 'nowhere_pkg.mod'" in check_loss_fn(
        Config.model_validate({"loss": {"name": "nowhere_pkg.mod:fn"}})
    )
    assert "has no function 'missing'" in check_loss_fn(
        Config.model_validate({"loss": {"name": f"{user_pkg}:missing"}})
    )
    with pytest.raises(ConfigError, match="has no function 'not_a_function'"):
        get_objective(f"{user_pkg}:not_a_function")


def test_user_objective_declares_its_own_settings(user_pkg):
    from streamrl.losses import resolve_loss

    lp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    inp = LossInputs(
        lp, lp.detach().clone(), torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 2, dtype=torch.float64)
    )
    settings = resolve_loss(Config.model_validate({"loss": {"name": f"{user_pkg}:weighted_reinforce", "weight": 3.0}}))
    assert settings.weight == 3.0
    loss, _ = compute_loss(settings, inp)
    loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-1.5, -1.5]], dtype=torch.float64))  # -3 A / 2 tokens
    assert resolve_loss(Config.model_validate({"loss": {"name": f"{user_pkg}:weighted_reinforce"}})).weight == 2.0
    with pytest.raises(ConfigError, match="loss.eps_low is not a setting"):
        resolve_loss(Config.model_validate({"loss": {"name": f"{user_pkg}:weighted_reinforce", "eps_low": 0.1}}))
    # without a settings attribute an objective gets the clip range
    assert resolve_loss(Config.model_validate({"loss": {"name": f"{user_pkg}:scaled_reinforce"}})).eps_high == 0.2


def test_a_user_objective_is_written_resolved_from_the_current_directory(tmp_path, monkeypatch):
    """RUN_DIR/config.yaml holds the user objective's settings; its module imports from the current
    directory as the roles import it, also where that directory is not on sys.path (the `streamrl` script)."""
    from streamrl.config.files import dump_config, load_config
    from streamrl.losses import resolve_loss

    (tmp_path / "cwd_losses.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    try:
        cfg = load_config(None, ["loss.name=cwd_losses:weighted_reinforce", "loss.weight=3"])
        dump_config(cfg, tmp_path / "config.yaml")
        again = load_config(tmp_path / "config.yaml")
        assert again.loss.model_extra == {"weight": 3.0} and resolve_loss(again).weight == 3.0
    finally:
        from streamrl.losses.registry import _USER_LOSSES

        sys.modules.pop("cwd_losses", None)
        _USER_LOSSES.pop("cwd_losses:weighted_reinforce", None)
