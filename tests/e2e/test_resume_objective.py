"""`streamrl up --resume RUN --set loss.name=dapo` on a grpo run says, before anything starts, that dapo's
own defaults replace grpo's (issue 42 item 3; the rules: tests/unit/test_resume_objective.py).

    pytest tests/e2e/test_resume_objective.py -q
"""

from __future__ import annotations

import subprocess
import sys

from streamrl.config.files import dump_config, load_config


def test_up_resume_with_another_objective_says_which_defaults_change(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    dump_config(load_config(None, []), run_dir / "config.yaml")  # a grpo run's written config
    # a missing model stops the command at the pre-flight, right after the objective is resolved
    res = subprocess.run(
        [sys.executable, "-m", "streamrl.cli", "up", "--resume", str(run_dir), "--set", "loss.name=dapo"]
        + ["--set", f"model.path={tmp_path / 'no-model'}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = res.stdout + res.stderr
    assert "resume: loss.name grpo -> dapo" in out and "eps_high 0.2 -> 0.28" in out, out
    assert "dynamic_sampling false -> true" in out and "model.path" in out and res.returncode != 0
