"""streamrl/assemble/join_policy.py: which keys a group waits for, timeout verdicts, error handling, reward mixing."""

import numpy as np
import pytest

from streamrl.assemble.join_policy import TIMEOUT_PRODUCER, JoinPolicy
from streamrl.config.files import load_config
from streamrl.config.schema import Config
from streamrl.core.errors import ConfigError
from streamrl.core.messages import Annotation


def policy(*external, reward_weight=1.0, kl_beta=0.0) -> JoinPolicy:
    return JoinPolicy(
        Config.model_validate(
            {"loss": {"kl_beta": kl_beta}, "annotations": {"reward_weight": reward_weight, "external": list(external)}}
        )
    )


def test_required_annotations_include_external_keys():
    cfg = load_config(None, ["annotations.external=[{key: judge, weight: 0.5, timeout_s: 3}, {key: sandbox}]"])
    assert cfg.required_annotations() == ["reward", "ref_logprobs", "judge", "sandbox"]
    assert cfg.annotations.external[1].on_timeout == "default" and cfg.annotations.external[1].timeout_s == 30


@pytest.mark.parametrize(
    "bad",
    [
        "[{key: reward}]",
        "[{key: j}, {key: j}]",
        "[{key: 'a b'}]",
        "[{key: j, on_timeout: retry}]",
        "[{key: j, timeout_s: 0}]",
    ],
)
def test_bad_external_specs_are_rejected_with_the_field(bad):
    with pytest.raises(ConfigError, match="annotations.external"):
        load_config(None, [f"annotations.external={bad}"])


def test_missing_lists_keys_any_rollout_lacks():
    p = policy({"key": "judge"})
    have = {"g:0": {"reward": 1, "judge": 1}, "g:1": {"reward": 1}}
    assert p.missing(["g:0", "g:1"], have) == {"judge"}
    assert p.missing(["g:0"], have) == set()
    assert p.missing(["g:2"], have) == {"reward", "judge"}


def test_verdicts_wait_then_apply_each_keys_policy():
    p = policy(
        {"key": "judge", "timeout_s": 5, "on_timeout": "default"},
        {"key": "sandbox", "timeout_s": 10, "on_timeout": "drop"},
    )
    assert p.verdict(set(), 0) == "ready"
    assert p.verdict({"judge"}, 4.9) == "wait"
    assert p.verdict({"judge"}, 5.0) == "default"
    assert p.verdict({"judge", "sandbox"}, 6) == "wait"  # sandbox is still inside its timeout
    assert p.verdict({"judge", "sandbox"}, 10) == "drop"
    assert p.verdict({"reward", "judge"}, 1e9) == "wait"  # built-in keys never time out


def test_errors_fail_builtin_keys_and_follow_policy_for_external_ones():
    p = policy({"key": "judge", "on_timeout": "default", "default": -1.0}, {"key": "sandbox", "on_timeout": "drop"})
    assert p.on_error("reward") == "fail" and p.on_error("judge") == "default" and p.on_error("sandbox") == "drop"
    errored = Annotation(rollout_id="g:0", key="judge", value=0.7, error="judge down")
    assert p.value(errored) == -1.0
    stand_in = p.stand_in("g:1", "judge")
    assert stand_in.value == -1.0 and stand_in.producer == TIMEOUT_PRODUCER and "timed out" in stand_in.error


def test_combine_is_the_configured_weighted_sum_and_keeps_each_part():
    p = policy({"key": "judge", "weight": 0.5}, {"key": "len", "weight": -2.0}, reward_weight=0.25)
    rows = [
        {
            "reward": Annotation("g:0", "reward", 1.0),
            "judge": Annotation("g:0", "judge", 0.4),
            "len": Annotation("g:0", "len", 0.1),
        },
        {
            "reward": Annotation("g:1", "reward", 0.0),
            "judge": Annotation("g:1", "judge", 1),
            "len": Annotation("g:1", "len", 0.0),
        },
    ]
    parts = p.components(rows)
    assert list(parts) == ["reward", "judge", "len"]
    np.testing.assert_allclose(parts["judge"], [0.4, 1.0])
    total = p.combine(parts)
    assert total.dtype == np.float32
    np.testing.assert_allclose(total, [0.25 * 1 + 0.5 * 0.4 - 2 * 0.1, 0.5 * 1.0], rtol=1e-6)
