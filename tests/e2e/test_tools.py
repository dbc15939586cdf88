"""Tool calls end to end: `streamrl up --config configs/tiny-tools-cpu.yaml` for the fewest steps
that show real python-tool calls executed by the env worker and counted in metrics.jsonl.

The same job runs on an external, password-protected broker (the session's redis-server) whose URL
carries the password inline (issue 42 item 4): `up` warns and trains, and afterwards the password is
nowhere under the run directory but RUN_DIR/broker/password (mode 0600): not in config.yaml, the logs,
summary.json, metrics, nor in `up`'s output. Every role of the job (trainer, generator, reward and env
workers) connects through that file. That a resume and every rank do too when they re-read
RUN_DIR/config.yaml is tests/integration/brokers/test_broker_password_roles.py's. (Once a job of its
own: a job's start-up is most of a tiny job's time.)

    pytest tests/e2e/test_tools.py
"""

from __future__ import annotations

import stat

import pytest

from bench.jobs import assert_exact, metrics, summary, up

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_tiny_tools_job_executes_tool_calls_and_keeps_an_inline_broker_password_private(tmp_path, redis_server):
    pw = redis_server.password
    url = f"redis://:{pw}@127.0.0.1:{redis_server.port}/0"
    run_dir = tmp_path / "tools"
    # On-policy (rollout.max_staleness=0: a batch waits for the weights it was generated with), checked
    # on this job's steps (once test_ctrl_c's job, which joined test_faults' resumed run).
    sets = ("trainer.steps=2", "run.export=false", f"broker.url={url}", "rollout.max_staleness=0")
    res = up(run_dir, *sets, config="tiny-tools-cpu.yaml", timeout=280)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        # max_turns=2 and every turn is a python call: each of the 16 episodes made 1 or 2 calls
        assert 16 <= r["tool_calls"] <= 32, r
        assert 0 <= r["tool_errors"] <= r["tool_calls"]
        assert r["turns_mean"] > 1 and r["env_tokens"] > 0 and r["episodes_failed"] == 0
        assert r["staleness_max"] == 0 and set(r["staleness_hist"]) == {"0"} and r["dropped_stale"] == 0
    s = summary(run_dir)
    assert s["invariant_holds"] and s["lost"] == 0

    # The inline password: warned about, then kept in one private file only.
    assert "carries its password inline" in out and "broker.password_file" in out, out[-4000:]
    assert_exact(s)
    assert pw not in out
    holders = sorted(
        str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file() and pw.encode() in p.read_bytes()
    )
    assert holders == ["broker/password"], holders
    secret = run_dir / "broker" / "password"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and stat.S_IMODE(secret.parent.stat().st_mode) == 0o700
