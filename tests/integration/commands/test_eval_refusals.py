"""`streamrl eval` refusals and `up --resume` on a finished run, in-process and fast (no broker, no engine,
no role): a run dir laid out as `up` leaves it (config.yaml written by dump_config, checkpoints/step-N with
their meta.json), without weights. The evaluation itself runs in tests/e2e/test_up.py on that job's run.

    pytest tests/integration/commands/test_eval_refusals.py -q
"""

from __future__ import annotations

from pathlib import Path

from streamrl.cli import main
from streamrl.commands.up import already_trained
from streamrl.config.files import dump_config, load_config


def run_dir(tmp_path: Path, *sets: str, steps: tuple[int, ...] = (2, 4)) -> Path:
    d = tmp_path / "run"
    cfg = load_config(None, ["model.path=/nonexistent/tiny", "trainer.steps=4", *sets])
    d.mkdir(parents=True)
    dump_config(cfg, d / "config.yaml")
    for s in steps:  # what list_checkpoints counts as complete: step-N/meta.json
        (d / "checkpoints" / f"step-{s:08d}").mkdir(parents=True)
        (d / "checkpoints" / f"step-{s:08d}" / "meta.json").write_text("{}")
    return d


def test_eval_refuses_a_missing_run(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nope'} does not exist" in err and "streamrl up" in err


def test_eval_refuses_a_missing_step_listing_those_there_are(tmp_path, capsys):
    d = run_dir(tmp_path)
    assert main(["eval", str(d), "--step", "3"]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint of step 3" in err and "the steps there are 0, 2, 4" in err, err
    assert not (d / "eval").exists()
    # a run without a checkpoint yet: the base model only when asked for (--step 0)
    bare = run_dir(tmp_path / "bare", steps=())
    assert main(["eval", str(bare)]) == 2
    assert "no complete checkpoint yet" in capsys.readouterr().err


def test_eval_refuses_a_multi_turn_run(tmp_path, capsys):
    d = run_dir(tmp_path, "env.fn=charclass_dialog", "task.name=charclass_dialog")
    assert main(["eval", str(d)]) == 2
    err = capsys.readouterr().err
    assert "multi-turn run (env.fn=charclass_dialog)" in err and "eval.every_steps" in err, err


def test_resume_of_a_finished_run_says_so_and_starts_nothing(tmp_path, capsys):
    d = run_dir(tmp_path)
    assert main(["up", "--resume", str(d)]) == 0
    out = capsys.readouterr().out
    assert f"nothing to resume: {d} already trained 4 steps (trainer.steps=4)" in out, out
    assert "--set trainer.steps=8" in out and f"streamrl eval {d}" in out
    assert not (d / "broker").exists() and not (d / "logs").exists()  # no broker, no role started
    # steps left (a raised trainer.steps, or a run stopped early): up goes on
    assert already_trained(d, 5) is None and already_trained(run_dir(tmp_path / "b", steps=(2,)), 4) is None
