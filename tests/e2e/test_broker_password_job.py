"""A job on an external, password-protected broker whose URL carries the password inline (issue 42 item 4):
`up` warns and trains, and afterwards the password is nowhere under the run directory but
RUN_DIR/broker/password (mode 0600): not in config.yaml, the logs, summary.json, metrics, nor in `up`'s
output. That every role, rank and a resume connect through that file when they re-read RUN_DIR/config.yaml
is tests/integration/brokers/test_broker_password_roles.py's (no second job here: the suite's time).

    pytest tests/e2e/test_broker_password_job.py
"""

from __future__ import annotations

import stat

import pytest

from bench.jobs import QUICK_RECOVERY, Job, assert_exact

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_a_job_with_an_inline_broker_password_leaves_it_in_one_private_file(tmp_path, redis_server):
    pw = redis_server.password
    url = f"redis://:{pw}@127.0.0.1:{redis_server.port}/0"
    run_dir = tmp_path / "run"
    common = [*QUICK_RECOVERY, "run.name=pwjob"]
    up = Job(run_dir, *common, f"broker.url={url}", "trainer.steps=1")
    assert up.wait(600) == 0, up.output()[-4000:]
    assert "carries its password inline" in up.output() and "broker.password_file" in up.output()
    assert_exact(up.summary())
    assert up.steps() == [1]
    assert pw not in up.output()
    holders = sorted(
        str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file() and pw.encode() in p.read_bytes()
    )
    assert holders == ["broker/password"], holders
    secret = run_dir / "broker" / "password"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and stat.S_IMODE(secret.parent.stat().st_mode) == 0o700
