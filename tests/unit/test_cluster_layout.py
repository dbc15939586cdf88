"""The cluster and partition key layout (streamrl.core.broker.Keys) and cluster URLs
(streamrl.core.broker_url), pure: docs/protocol.md "Key layout" and docs/scaling-brokers.md."""

from __future__ import annotations

import pytest

from streamrl.config.schema import BrokerConfig
from streamrl.core.broker import Keys, key_slot
from streamrl.core.broker_url import parse_cluster_url, redact_cluster
from streamrl.core.errors import BrokerError, ConfigError, StreamRLError


def test_one_partition_on_one_server_keeps_the_unpartitioned_names():
    keys = Keys("tiny")
    assert (keys.rollouts, keys.annotations, keys.prompts) == (
        "streamrl:tiny:rollouts",
        "streamrl:tiny:annotations",
        "streamrl:tiny:prompts",
    )
    assert keys.rollout_streams == [keys.rollouts] and keys.rollouts_for("g7") == keys.rollouts


def test_the_cluster_layout_tags_every_key_with_the_run():
    keys = Keys("tiny", cluster=True)
    assert keys.prompts == "streamrl:tiny:{tiny}:prompts" and keys.rollouts == "streamrl:tiny:{tiny}:rollouts"
    assert keys.worker("reward", "r-0") == "streamrl:tiny:{tiny}:workers:reward:r-0"
    assert len({key_slot(k.split("{")[1].split("}")[0]) for group in keys.together() for k in group}) == 1


def test_partitions_spread_over_even_slot_ranges_and_a_group_has_one():
    keys = Keys("job", 4, cluster=True)
    slots = [key_slot(s.split("{")[1].split("}")[0]) for s in keys.rollout_streams]
    assert [i * 4096 <= s < (i + 1) * 4096 for i, s in enumerate(slots)] == [True] * 4
    assert {keys.partition_of(f"g{i}") for i in range(100)} == {0, 1, 2, 3}
    gid = "g42"
    i = keys.partition_of(gid)
    assert keys.rollouts_for(gid) == keys.rollout_streams[i] and keys.annotations_for(gid) == keys.annotation_streams[i]


def test_the_single_stream_names_refuse_a_partitioned_run():
    with pytest.raises(StreamRLError, match="rollouts_for"):
        _ = Keys("job", 2).rollouts


def test_bad_partition_counts_and_braced_run_names_are_refused():
    with pytest.raises(ConfigError, match="1 or more"):
        Keys("job", 0)
    with pytest.raises(ConfigError, match="brace"):
        Keys("a{b}")


def test_cluster_urls_parse_and_redact():
    url = "redis+cluster://u:p%40ss@10.0.0.1:7000,10.0.0.2:7001,[::1]:7002"
    assert parse_cluster_url(url) == ([("10.0.0.1", 7000), ("10.0.0.2", 7001), ("::1", 7002)], "u", "p@ss")
    assert redact_cluster(url) == "redis+cluster://u:***@10.0.0.1:7000,10.0.0.2:7001,[::1]:7002"
    with pytest.raises(BrokerError, match="HOST:PORT"):
        parse_cluster_url("redis+cluster://:pw@10.0.0.1")


def test_the_config_accepts_a_cluster_url_and_names_the_form_of_a_bad_one():
    assert BrokerConfig(url="redis+cluster://:pw@127.0.0.1:7000").url.startswith("redis+cluster://")
    with pytest.raises(ValueError, match="names no node; use redis"):
        BrokerConfig(url="redis+cluster://:pw@")


def redis_cli_split(masters: int) -> list[tuple[int, int]]:
    """The slot ranges `redis-cli --cluster create` gives `masters` masters (redis-cli.c: a float cursor,
    each master's last slot lround(cursor + per_node - 1), the last master up to 16383)."""
    per_node, first, cursor, out = 16384 / masters, 0, 0.0, []
    for i in range(masters):
        last = 16383 if i == masters - 1 else max(first, int(cursor + per_node - 1 + 0.5))
        out.append((first, last))
        first, cursor = last + 1, cursor + per_node
    return out


@pytest.mark.parametrize("partitions", [3, 5, 6, 7, 12])
def test_p_partitions_land_on_p_masters_of_a_redis_cli_cluster(partitions):
    # run11090's first candidate for partition 2 of 3 hashes to slot 10922: the end of the 2nd master's
    # range, where i*16384//3 puts the start of the 3rd partition's.
    split = redis_cli_split(partitions)
    for run in ["tiny", "run11090", *(f"job{k}" for k in range(200))]:
        keys = Keys(run, partitions, cluster=True)
        slots = [key_slot(s.split("{")[1].split("}")[0]) for s in keys.rollout_streams]
        owners = [next(m for m, (a, b) in enumerate(split) if a <= s <= b) for s in slots]
        assert owners == list(range(partitions)), (run, slots, split)
