"""The Python API's job handle with real processes: a script starts a job and follows its rows, SIGTERM to
the script while it waits for one stops the job as Ctrl-C and SIGTERM stop `streamrl up` (roles asked to finish, the
accounting written; Job.wait turns SIGTERM into the KeyboardInterrupt Ctrl-C raises, and both take
Job.stop's path), and the Result says it was stopped. The whole job, trained to its
end: tests/e2e/test_up.py.

    pytest tests/integration/launch/test_python_api_job.py
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = """
import json, sys
import streamrl

if __name__ == "__main__":
    # the fewest roles (trainer, feeder, reward): what is checked is the launcher, not the roles
    overrides = {"trainer.steps": 2, "run.export": False, "generator.count": 0, "loss.kl_beta": 0}
    config = streamrl.load_config("tiny-cpu", overrides)
    job = streamrl.start(config, run_dir=sys.argv[1], check=False)
    print("waiting", flush=True)
    rows = list(job.rows())  # as examples/python_api.py: each step's row until the job ends
    result = job.wait()
    print(json.dumps({"code": result.code, "stopped": result.stopped, "steps": result.steps,
                      "model_dir": result.model_dir, "summary": result.summary, "lines": job.lines, "rows": rows}, default=str), flush=True)
"""


@pytest.mark.timeout(180)
def test_sigterm_while_waiting_stops_the_job(tmp_path):
    script, run_dir = tmp_path / "job.py", tmp_path / "run"
    script.write_text(SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(run_dir)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out = []
        for line in proc.stdout:  # SIGTERM once the roles are being started, while the script waits
            out.append(line)
            if line.startswith("started "):
                time.sleep(0.5)
                proc.send_signal(signal.SIGTERM)
                break
        rest, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:  # a failure above: stop the job as a user would, so no role is left behind
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    out = "".join(out) + rest
    assert proc.returncode == 0, out + err
    assert "waiting" in out and "stopping: asking every role to finish its current work" in out, out
    result = json.loads(out.strip().splitlines()[-1])
    assert result["code"] == 130 and result["stopped"] and result["steps"] == 0 and result["model_dir"] is None
    assert result["rows"] == []  # stopped before its first step
    assert result["summary"] is not None and result["summary"]["invariant_holds"], result["summary"]
    lines = "\n".join(result["lines"])  # Job.lines: what was printed
    assert lines.startswith(f"streamrl: run 'tiny' in {run_dir}"), lines
    assert f"stopped; continue this run with `streamrl up --resume {run_dir}`" in lines
    assert (run_dir / "summary.json").is_file() and (run_dir / "config.yaml").is_file()
    # (stopped before its first step, the run dir is not "used": a new start there starts afresh,
    # tests/integration/launch/test_rundir.py)
