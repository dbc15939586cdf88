"""The end of a `streamrl up` job, with real processes and a real checkpoint: the launcher sees the
trainer's exit at once (not a poll later), and RUN_DIR/hf is exported while the roles stop, becoming
RUN_DIR/hf only when the job succeeds.

    pytest tests/integration/launch/test_job_end.py
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from streamrl.config.files import dump_config
from streamrl.config.schema import Config
from streamrl.launch.job import Export
from streamrl.launch.supervisor import WATCH_INTERVAL_S, Child, Supervisor
from streamrl.models.tiny import build_tiny_model
from streamrl.train.checkpoint import list_checkpoints
from streamrl.train.export import checkpoint_model_state


def _trainer(tmp_path: Path, seconds: float) -> Child:
    proc = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])
    return Child("trainer", "trainer-0", proc, tmp_path / "trainer-0.out")


def test_the_watch_loop_wakes_when_the_trainer_exits(tmp_path):
    sup = Supervisor(Config(), tmp_path, "redis://unused")
    trainer = _trainer(tmp_path, 0.1)
    time.sleep(0.05)
    start = time.monotonic()
    sup._pause(trainer)
    assert trainer.proc.poll() == 0
    assert time.monotonic() - start < WATCH_INTERVAL_S - 0.1, "the end of the job waited out the poll"

    start = time.monotonic()
    sup._pause(trainer)  # exited (or in its restart back-off): the loop keeps its pace, no busy loop
    assert time.monotonic() - start >= WATCH_INTERVAL_S * 0.9


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A finished 2-step SFT run on the tiny model: config.yaml and a checkpoint, as up's trainer leaves."""
    from workers.sft import main

    root = tmp_path_factory.mktemp("job")
    data = root / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}:", "completion": f"a{i}"}) + "\n" for i in range(32)))
    model = build_tiny_model(Config().model.tiny, root / "tiny", seed=0)
    cfg = Config.model_validate(
        {
            "model": {"path": str(model)},
            "sft": {"data": str(data), "batch_size": 8, "max_seq_len": 16, "eval_fraction": 0.25},
            "trainer": {"steps": 2, "checkpoint_every": 2},
        }
    )
    run = root / "run"
    run.mkdir()
    dump_config(cfg, run / "config.yaml")
    assert main(cfg, run)
    return run


def test_the_export_is_written_in_the_background_and_loads(run_dir):
    from transformers import AutoModelForCausalLM

    (run_dir / "hf").mkdir(exist_ok=True)  # an earlier export of this run (--resume): replaced
    (run_dir / "hf" / "config.json").write_text("{}")
    export = Export(run_dir)
    export.warm()  # the first step is in: imports while the job trains
    export.start()  # the trainer exited after its last step
    assert export.finish() == f"model: {run_dir / 'hf'}"
    assert not export.staging.exists()
    model = AutoModelForCausalLM.from_pretrained(run_dir / "hf")
    want = checkpoint_model_state(list_checkpoints(run_dir)[2])
    got = model.state_dict()
    assert want.keys() <= got.keys()
    assert all(torch.equal(got[k], v) for k, v in want.items())


@pytest.mark.parametrize("trained", [True, False])
def test_a_job_that_does_not_succeed_leaves_no_export(run_dir, tmp_path, trained):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("hf"))
    export = Export(copy)
    export.warm()
    if trained:  # the export was written, then the job failed its accounting (or was stopped)
        export.start()
    export.discard()
    assert not (copy / "hf").exists() and not export.staging.exists()


def test_a_failed_export_names_the_command_that_redoes_it(tmp_path):
    (tmp_path / "config.yaml").write_text("")
    line = Export(tmp_path).finish()  # never started: finish runs it
    assert line.startswith("export failed (ConfigError") and "no complete checkpoint" in line
    assert f"retry with `streamrl export {tmp_path} --out {tmp_path / 'hf'}`" in line
    assert not (tmp_path / "hf").exists()


def test_run_export_false_writes_nothing_and_says_how_to_export(run_dir, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("hf", ".hf-export"))
    export = Export(copy, enabled=False)
    export.warm()  # what up calls at the first step and when the trainer exits: nothing starts
    export.start()
    assert export._thread is None
    line = export.finish()
    assert line == f"model: not exported (run.export=false); `streamrl export {copy} --out {copy / 'hf'}` writes it"
    assert not (copy / "hf").exists() and not export.staging.exists()
