"""The console's step lines (streamrl/launch/progress.py): the optimisation in compact form, the share of
groups without a learning signal and a warning when none had one, a resumed run's old steps not shown
as new, and the command a stopped run prints to continue (pure, files only).

    pytest tests/unit/test_progress.py -q
"""

from __future__ import annotations

import json

import numpy as np

from streamrl.core.batch import zero_variance_frac
from streamrl.launch.job import continue_hint, resume_at
from streamrl.launch.progress import NO_SIGNAL_STEPS, Progress, step_line


def _row(step: int, **extra) -> dict:
    base = {
        "step": step,
        "reward_mean": 0.25,
        "staleness_max": 1,
        "samples": 8,
        "tokens": 100,
        "wait_s": 0.5,
        "train_s": 0.5,
        "time_s": 3.0,
    }
    return {**base, **extra}


def test_step_line_shows_loss_kl_entropy_and_grad_norm():
    line = step_line(_row(2, loss=0.01234, kl=0.00312, entropy=1.4217, grad_norm=0.8712, zero_variance_frac=0.5), 10)
    assert line.startswith("step    2/10 | reward 0.250 | loss 0.0123 kl 0.0031 ent 1.42 gnorm 0.871 | no signal 50%")
    assert "kl" not in step_line(_row(2, loss=0.1), 10)  # only what the objective logged


def test_step_line_shows_mfu_and_the_generators_rate_where_known():
    line = step_line(_row(3, mfu=0.2834, gen_tokens_per_s=12345.6, gen_busy=0.91), 10, verbose=True)
    assert (
        "trainer wait 0.50s train 0.50s mfu 28.3% | generators 12,346 tok/s, busy 91% of the time | elapsed 3s" in line
    )
    assert "mfu" not in step_line(_row(3), 10, verbose=True) and "generators" not in step_line(
        _row(3), 10, verbose=True
    )


def test_step_line_shows_groups_dropped_stale_once_there_are_any():
    assert "| dropped stale 3 groups" in step_line(_row(4, dropped_stale=3.0), 10)
    assert "dropped stale" not in step_line(_row(4, dropped_stale=0.0), 10)


def test_zero_variance_frac_is_the_share_of_groups_with_equal_rewards():
    rewards = np.array([1, 0, 0.5, 0.5, 0, 0])
    assert zero_variance_frac(rewards, np.array([0, 0, 1, 1, 2, 2])) == 2 / 3
    assert zero_variance_frac(np.array([]), np.array([])) == 0.0


def test_warns_once_after_steps_without_any_signal():
    said: list[str] = []
    p = Progress(20, said.append)
    p.show([_row(1, zero_variance_frac=1.0), _row(2, zero_variance_frac=0.5)])  # step 2 had a signal
    p.show([_row(s, zero_variance_frac=1.0) for s in range(3, 3 + NO_SIGNAL_STEPS + 2)])
    warnings = [s for s in said if s.startswith("warning: no learning signal")]
    assert len(warnings) == 1 and f"for {NO_SIGNAL_STEPS} steps (to step {2 + NO_SIGNAL_STEPS})" in warnings[0]
    assert "streamrl samples" in warnings[0]


def test_a_resumed_run_does_not_show_its_old_steps_again():
    said: list[str] = []
    p = Progress(20, said.append, after_step=3)
    p.show([_row(s) for s in (1, 2, 3, 4)])
    p.show([_row(s) for s in (1, 2, 3, 4, 5)])  # the file is read whole each time
    assert [s.split("|")[0].strip() for s in said] == ["step    4/20", "step    5/20"]


def test_a_resume_starts_at_the_newest_checkpoint_and_drops_the_rows_above_it(tmp_path):
    assert resume_at(tmp_path) == 0
    for step in (2, 4):
        (tmp_path / "checkpoints" / f"step-{step}").mkdir(parents=True)
        (tmp_path / "checkpoints" / f"step-{step}" / "meta.json").write_text("{}")
    (tmp_path / "checkpoints" / "step-6").mkdir()  # incomplete: no meta.json
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(_row(s)) + "\n" for s in range(1, 7)))
    assert resume_at(tmp_path) == 4
    # Steps 5 and 6 are trained again: their old rows must not be shown as the new ones.
    assert [json.loads(ln)["step"] for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]


def test_a_stopped_run_prints_how_to_continue(tmp_path):
    assert f"`streamrl up --resume {tmp_path}`" in continue_hint(tmp_path)


def test_the_first_step_of_a_job_says_how_long_its_start_up_took():
    import time

    said: list[str] = []
    p = Progress(10, said.append, after_step=3, started_at=time.time() - 12.5)
    p.show([_row(s) for s in (1, 2, 3)])  # a resumed run's old steps: not this job's first
    assert said == [] and p.first_step_s is None
    p.show([_row(s) for s in (1, 2, 3, 4, 5)])
    first = [line for line in said if line.startswith("first step")]
    assert first == [
        f"first step {p.first_step_s:.1f}s after the command (start-up: pre-flight, broker, roles, first batch)"
    ]
    assert 12.5 <= p.first_step_s < 20 and said.index(first[0]) == 1  # once, right after step 4's line
    plain: list[str] = []
    Progress(10, plain.append).show([_row(1)])  # no start time given: no such line
    assert len(plain) == 1 and plain[0].startswith("step")
