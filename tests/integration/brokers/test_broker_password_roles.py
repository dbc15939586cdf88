"""A password-protected external broker, named three ways, against a real redis-server: `streamrl config`
prints no password, the run directory holds it only in RUN_DIR/broker/password (0600), and a command
that re-reads RUN_DIR/config.yaml alone (no --broker, no $STREAMRL_BROKER_URL: as `streamrl worker` on
another host, a resumed `up`, every role) connects with it (issue 42 item 4).

    pytest tests/integration/brokers/test_broker_password_roles.py -q
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamrl.config.files import dump_config, load_config

ROOT = Path(__file__).resolve().parents[3]


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "STREAMRL_BROKER_URL"}
    return subprocess.run(
        [sys.executable, "-m", "streamrl.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**base, **(env or {})},
    )


def holders(run_dir: Path, secret: str) -> list[str]:
    return sorted(
        str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()
    )


def test_streamrl_config_prints_no_password_and_names_the_better_way(redis_server):
    url = f"redis://:{redis_server.password}@127.0.0.1:{redis_server.port}/0"
    res = cli("config", "--set", f"broker.url={url}")
    assert res.returncode == 0, res.stderr  # the pre-flight PING went through with the password
    assert redis_server.password not in res.stdout + res.stderr
    assert f"url: redis://:***@127.0.0.1:{redis_server.port}/0" in res.stdout
    assert "broker.password_file" in res.stderr and "broker.password_env" in res.stderr


@pytest.mark.parametrize("how", ["inline", "password_env", "password_file"])
def test_a_command_re_reading_config_yaml_connects_and_nothing_else_holds_the_password(redis_server, tmp_path, how):
    pw, plain = redis_server.password, f"redis://127.0.0.1:{redis_server.port}/0"
    env, overrides = {}, []
    if how == "inline":
        overrides = [f"broker.url=redis://:{pw}@127.0.0.1:{redis_server.port}/0"]
    elif how == "password_env":
        env = {"STREAMRL_TEST_BROKER_PW": pw}
        overrides = [f"broker.url={plain}", "broker.password_env=STREAMRL_TEST_BROKER_PW"]
    else:
        secret = tmp_path / "pw"
        secret.write_text(pw)
        overrides = [f"broker.url={plain}", f"broker.password_file={secret}"]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    dump_config(load_config(None, [*overrides, "run.name=pwtest"]), run_dir / "config.yaml")  # as `up` writes it
    res = cli("account", "--config", str(run_dir / "config.yaml"), "--run-dir", str(run_dir), env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "run pwtest" in res.stdout and (run_dir / "summary.json").is_file()
    assert pw not in res.stdout + res.stderr
    assert holders(run_dir, pw) == (["broker/password"] if how == "inline" else [])
    if how == "password_env":  # without the variable: the error names it, and nothing connects
        res = cli("account", "--config", str(run_dir / "config.yaml"), "--run-dir", str(run_dir))
        assert res.returncode != 0 and "export STREAMRL_TEST_BROKER_PW=" in res.stdout + res.stderr
