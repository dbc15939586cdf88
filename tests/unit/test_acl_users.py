"""The arguments `streamrl producer` and `streamrl envuser` share (streamrl/commands/acl_users.py), no broker:
pytest tests/unit/test_acl_users.py -q"""

import argparse

import pytest

from streamrl.commands import acl_users, envuser, producer
from streamrl.core.errors import ConfigError

URL = "redis://:admin@localhost:1/0"


@pytest.mark.parametrize("cmd, who", [(producer, "the producer"), (envuser, "the env user")])
def test_both_commands_read_the_same_user_arguments_and_name_a_bad_name(cmd, who):
    p = argparse.ArgumentParser()
    cmd.add_arguments(p)
    args = p.parse_args(["add", "bad name", "--run", "tiny", "--broker", URL])
    assert (args.action, args.name, args.run, args.broker, args.run_dir) == ("add", "bad name", "tiny", URL, None)
    with pytest.raises(ConfigError, match=f"give {who} a NAME of letters, digits"):
        cmd.run(args)  # rejected before any connection
    with pytest.raises(ConfigError, match=f"give {who} a NAME"):
        cmd.run(p.parse_args(["remove", "--run", "tiny", "--broker", URL]))
    listing = p.parse_args(["list", "--run", "tiny", "--broker", URL])
    assert acl_users.admin_url(listing, who, "example") == URL  # `list` needs no NAME
