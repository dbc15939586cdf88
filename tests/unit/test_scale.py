"""`streamrl scale`: ROLE=N parsing, the scale file it writes, and what the supervisor reads from it."""

import json

import pytest

from streamrl.commands.scale import parse_counts, write_counts
from streamrl.config.schema import Config
from streamrl.core.errors import ConfigError
from streamrl.launch.supervisor import SCALE_FILE, Supervisor


def test_parse_counts():
    assert parse_counts(["generator=2", "reward=0"]) == {"generator": 2, "reward": 0}
    for bad in ["trainer=2", "feeder=1", "generator", "generator=-1", "generator=two"]:
        with pytest.raises(ConfigError, match="ROLE=N"):
            parse_counts([bad])


def test_counts_merge_and_the_supervisor_reads_them(tmp_path):
    sup = Supervisor(Config(), tmp_path, "redis://unused")
    assert sup.desired_counts() == {}
    write_counts(tmp_path, {"generator": 3})
    assert write_counts(tmp_path, {"reward": 2}) == {"generator": 3, "reward": 2}
    assert sup.desired_counts() == {"generator": 3, "reward": 2}
    assert not list(tmp_path.glob("*.tmp"))
    (tmp_path / SCALE_FILE).write_text('{"generator": ')  # torn or hand-edited: ignored until fixed
    assert sup.desired_counts() == {}
    (tmp_path / SCALE_FILE).write_text(json.dumps({"trainer": 4, "generator": 1}))
    assert sup.desired_counts() == {"generator": 1}  # only scalable roles
