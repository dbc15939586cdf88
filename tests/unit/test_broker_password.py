"""A broker password never reaches a file, a line of output or an error text in clear (issue 42 item 4):
URL redaction and splitting, broker.password_env / broker.password_file, and RUN_DIR/config.yaml.

    pytest tests/unit/test_broker_password.py -q
"""

from __future__ import annotations

import stat

import pytest
import yaml

from streamrl.config.files import dump_config, load_config, resolved_dump
from streamrl.config.job import BrokerConfig
from streamrl.core.broker_url import redact_url, split_password, with_password
from streamrl.core.errors import ConfigError

PW = "s3cr3t-Pa55"
URLS = [
    f"redis://:{PW}@10.0.0.1:6379/0",
    f"redis://alice:{PW}@10.0.0.1:6379/0",
    f"rediss://:{PW}@broker.example:6380/2",
    f"unix://:{PW}@/run/redis/redis.sock?db=0",
    f"redis+cluster://:{PW}@10.0.0.1:7000,10.0.0.2:7000",
    f"rediss+cluster://bob:{PW}@10.0.0.1:7000",
    f"redis://10.0.0.1:6379/0?password={PW}&db=1",
]


@pytest.mark.parametrize("url", URLS)
def test_every_url_kind_is_redacted_and_split(url):
    assert PW not in redact_url(url) and "***" in redact_url(url)
    stripped, password = split_password(url)
    assert password == PW and PW not in stripped
    again = with_password(stripped, password)
    assert split_password(again) == (stripped, PW)
    assert split_password(stripped) == (stripped, None)


def test_a_url_without_password_is_left_alone():
    for url in ("embedded", "redis://10.0.0.1:6379/0", "redis+cluster://10.0.0.1:7000", "redis://u@h:1/0"):
        assert redact_url(url) == url and split_password(url) == (url, None)


def test_password_env_and_file_give_the_connect_url(tmp_path, monkeypatch):
    monkeypatch.setenv("BROKER_PW", PW)
    b = BrokerConfig(url="redis+cluster://10.0.0.1:7000,10.0.0.2:7000", password_env="BROKER_PW")
    assert b.connect_url() == f"redis+cluster://:{PW}@10.0.0.1:7000,10.0.0.2:7000"
    assert b.inline_password_warning() is None
    f = tmp_path / "pw"
    f.write_text(PW + "\n")
    b = BrokerConfig(url="redis://alice@10.0.0.1:6379/0", password_file=str(f))
    assert b.connect_url() == f"redis://alice:{PW}@10.0.0.1:6379/0"
    monkeypatch.delenv("BROKER_PW")
    with pytest.raises(ConfigError, match=r"export BROKER_PW="):
        BrokerConfig(url="redis://h:1/0", password_env="BROKER_PW").connect_url()
    with pytest.raises(ConfigError, match="cannot read it"):
        BrokerConfig(url="redis://h:1/0", password_file=str(tmp_path / "missing")).connect_url()


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(url=f"redis://:{PW}@h:1/0", password_env="X"), "drop the password from broker.url"),
        (dict(url="redis://h:1/0", password_env="X", password_file="/f"), "keep one"),
        (dict(url="embedded", password_file="/f"), "makes its own password"),
        (dict(url="redis://h:1/0", password_env=PW), "not an environment variable name"),
    ],
)
def test_contradicting_password_settings_are_refused_without_echoing_it(fields, match):
    with pytest.raises(ValueError, match=match) as info:
        BrokerConfig(**fields)
    assert PW not in str(info.value) or fields.get("password_env") == PW


def test_an_inline_password_is_warned_about_and_never_written(tmp_path):
    cfg = load_config(None, [f"broker.url=redis+cluster://:{PW}@10.0.0.1:7000,10.0.0.2:7000"])
    warning = cfg.broker.inline_password_warning()
    assert "broker.password_file" in warning and "broker.password_env" in warning and PW not in warning
    shown = yaml.safe_dump(resolved_dump(cfg))  # what `streamrl config` prints
    assert PW not in shown and "redis+cluster://:***@10.0.0.1:7000" in shown
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    dump_config(cfg, run_dir / "config.yaml")  # what `streamrl up` writes
    assert PW not in (run_dir / "config.yaml").read_text()
    secret = run_dir / "broker" / "password"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and stat.S_IMODE(secret.parent.stat().st_mode) == 0o700
    holders = [p for p in run_dir.rglob("*") if p.is_file() and PW.encode() in p.read_bytes()]
    assert holders == [secret]
    again = load_config(run_dir / "config.yaml")  # every role, every rank, --resume
    assert again.broker.connect_url() == cfg.broker.url
    assert again.broker.inline_password_warning() is None
    dump_config(again, run_dir / "config.yaml")  # written again on resume: the same file
    assert load_config(run_dir / "config.yaml").broker == again.broker


def test_a_bad_set_of_the_url_does_not_echo_the_password():
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"broker.url=http://:{PW}@h:1"])
    assert PW not in str(info.value)
