"""The Python API's job handle with real processes: streamrl.start returns once the job has started,
stop() ends it as Ctrl-C ends `streamrl up` (roles asked to finish, the accounting written), and the
Result says it was stopped. The whole job, trained to its end: tests/e2e/test_up.py.

    pytest tests/integration/launch/test_python_api_job.py
"""

from __future__ import annotations

import pytest

import streamrl


@pytest.mark.timeout(180)
def test_start_then_stop_ends_the_job_as_ctrl_c_does(tmp_path):
    # the fewest roles (trainer, feeder, reward): what is checked is the launcher, not the roles
    config = streamrl.load_config(
        "tiny-cpu", {"trainer.steps": 2, "run.export": False, "generator.count": 0, "loss.kl_beta": 0}
    )
    job = streamrl.start(config, run_dir=tmp_path / "run", check=False, echo=False)
    assert job.run_dir == (tmp_path / "run").resolve() and not job.done
    result = job.stop()  # as soon as it started: every role is still starting
    assert job.done and result.stopped and result.code == 130
    assert result.steps == 0 and result.model_dir is None and job.step == 0
    lines = "\n".join(job.lines)
    assert lines.startswith(f"streamrl: run 'tiny' in {job.run_dir}"), lines
    assert "stopping: asking every role to finish its current work" in lines
    assert f"stopped; continue this run with `streamrl up --resume {job.run_dir}`" in lines
    assert result.summary is not None and result.summary["invariant_holds"], result.summary
    assert (job.run_dir / "summary.json").is_file() and (job.run_dir / "config.yaml").is_file()
    with pytest.raises(streamrl.ConfigError, match="already holds a run"):  # the CLI's refusal, too
        streamrl.start(config, run_dir=job.run_dir, check=False, echo=False)
