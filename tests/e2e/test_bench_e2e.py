"""`streamrl bench e2e` runs a real `streamrl up` (vLLM CPU generator, FSDP2 trainer, every role a
process) and summarizes it from metrics.jsonl and the role logs into well-formed result.json.

    pytest tests/e2e/test_bench_e2e.py -m slow
"""

from __future__ import annotations

import json

import pytest

from bench.jobs import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_e2e_bench_summarizes_a_real_job(tmp_path):
    out = tmp_path / "out"
    # no reference worker (loss.kl_beta=0): the summary does not depend on it
    proc = run_cli(
        "bench", "e2e", "--steps", "2", "--no-sync", "--out", str(out), "--set", "loss.kl_beta=0", timeout=880
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    (run,) = result["runs"]
    assert run["mode"] == "async" and run["steps"] == 2 and run["max_staleness"] == 1
    assert run["trained_tokens_per_s"] > 0 and run["generated_tokens_per_s"] > 0
    assert 0 < run["busy"]["trainer"] <= 1 and 0 <= run["busy"]["generator:generator-0"] <= 1
    assert sum(run["staleness_hist_tokens"].values()) == run["trained_tokens"]
    assert max(int(k) for k in run["staleness_hist_tokens"]) <= 1
    assert 0 < run["first_step_s"] < run["wall_s"]  # up launched -> step 1's log line
    assert result["speedup"] is None  # no sync job was run
    assert (out / "e2e.png").is_file() and (out / "plots" / "async" / "staleness.png").is_file()
