"""The sharded broker's routing rule (pure): stable, placement first, hash tags.

pytest tests/unit/test_sharding.py
"""

from __future__ import annotations

import pytest

from brokers.sharded import key_name, parse_placement, shard_of
from streamrl.core.broker import Keys
from streamrl.core.errors import ConfigError


def test_key_name_is_what_follows_the_run_prefix():
    k = Keys("my-run")
    assert key_name(k.rollouts) == "rollouts"
    assert key_name(k.worker("generator", "generator-0")) == "workers:generator:generator-0"
    assert key_name("plain-key") == "plain-key"
    assert key_name("streamrl:{job7}:rollouts") == "job7"  # a hash tag wins


def test_routing_is_stable_across_runs_and_processes():
    a, b = Keys("run-a"), Keys("run-b")
    placement = {"rollouts": 1, "annotations": 2}
    for k in (a, b):  # placed names go where placed, in every run; the rest stays on server 0
        assert shard_of(k.rollouts, 3, placement) == 1
        assert shard_of(k.annotations, 3, placement) == 2
        assert shard_of(k.prompts, 3, placement) == 0
        assert shard_of(k.feeder_admitted, 3, placement) == 0
    tagged = [shard_of(f"streamrl:{{job{i}}}:rollouts", 4) for i in range(40)]
    assert set(tagged) == {0, 1, 2, 3}  # hash tags spread over every server
    assert tagged == [shard_of(f"streamrl:{{job{i}}}:rollouts", 4) for i in range(40)]
    assert {shard_of(f"other:key{i}", 4) for i in range(40)} == {0}  # untagged keys outside a run: server 0


def test_placement_overrides_the_default():
    k = Keys("r")
    assert shard_of(k.rollouts, 2) == 0
    assert shard_of(k.rollouts, 2, {"rollouts": 1}) == 1


def test_parse_placement_names_the_fix():
    assert parse_placement("rollouts=0, annotations=1") == {"rollouts": 0, "annotations": 1}
    with pytest.raises(ConfigError, match="NAME=INDEX"):
        parse_placement("rollouts:0")
