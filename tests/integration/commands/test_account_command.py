"""`streamrl account` (the accounting of a run started by hand, docs/multihost.md) against a real
redis-server: exit 0 and a summary when nothing is lost, 3 naming the loss when a group vanished.

    pytest tests/integration/commands/test_account_command.py
"""

from __future__ import annotations

import json
import subprocess
import sys

from streamrl.core.broker import Keys


def account(url: str, run: str, run_dir) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "streamrl.cli", "account", "--run", run, "--broker", url, "--run-dir", str(run_dir)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_account_exits_3_when_a_group_is_lost(redis_server, run_name, tmp_path):
    import redis

    ok = account(redis_server.url, run_name, tmp_path / "a")
    assert ok.returncode == 0 and "invariant holds" in ok.stdout, ok.stdout + ok.stderr
    r = redis.Redis.from_url(redis_server.url)
    try:
        r.set(Keys(run_name).feeder_admitted, 1)  # admitted, and then nowhere: lost
    finally:
        r.close()
    bad = account(redis_server.url, run_name, tmp_path / "b")
    assert bad.returncode == 3 and "lost 1" in bad.stdout and "VIOLATED" in bad.stdout, bad.stdout + bad.stderr
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["lost"] == 1


def test_up_s_summary_carries_the_jobs_start_up(redis_server, run_name, tmp_path):
    from streamrl.core.accounting import write_summary

    s = write_summary(redis_server.url, run_name, tmp_path, extra={"first_step_s": 12.3})
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == s and on_disk["first_step_s"] == 12.3 and on_disk["invariant_holds"]
