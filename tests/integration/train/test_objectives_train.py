"""Each objective trains 2 steps when chosen by `--set loss.name=X` on the default config, with the
config read back from RUN_DIR/config.yaml as the trainer reads it (issue 26, defect 1: gspo and
dr_grpo died at trainer start on the written config's spelled-out defaults); a batch whose rows are
all masked stops the job instead of a step on nothing (defect 2).

    pytest tests/integration/train/test_objectives_train.py
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from streamrl.config.files import dump_config, load_config
from streamrl.core.errors import FatalError
from streamrl.losses.registry import available_losses
from streamrl.train.dist import launch
from streamrl.train.hf_engine import HFEngine
from tests.integration.train.shaped_batch import shaped_batch


def _two_steps(model_path: str, config: str, out: str, rank: int, world: int) -> None:
    torch.set_num_threads(1)
    cfg = load_config(config)  # RUN_DIR/config.yaml, as every trainer rank reads it
    engine = HFEngine(cfg, model_path, rank, world)
    batch = shaped_batch(engine.model.config.vocab_size, [(3, 5), (6, 2), (2, 7), (4, 4)], seed=0)
    batch.ref_logprobs = [r.logprobs - 0.1 for r in batch.rollouts]  # the default config has kl_beta > 0
    steps = [engine.train_step(batch) for _ in range(2)]
    Path(out, "steps.json").write_text(json.dumps({"steps": steps, "loss": engine.loss.model_dump(mode="json")}))


@pytest.mark.parametrize("objective", available_losses())
def test_each_objective_trains_two_steps_from_the_written_config(objective, tiny, tmp_path):
    cfg = load_config(None, [f"loss.name={objective}", "trainer.device=cpu", "trainer.micro_batch_size=4"])
    dump_config(cfg, tmp_path / "config.yaml")
    launch(1, functools.partial(_two_steps, str(tiny), str(tmp_path / "config.yaml"), str(tmp_path)))
    got = json.loads((tmp_path / "steps.json").read_text())
    assert got["loss"]["name"] == objective
    for m in got["steps"]:
        assert np.isfinite(m["loss"]) and np.isfinite(m["grad_norm"]) and m["skipped_step"] == 0


def _masked_step(model_path: str, rank: int, world: int) -> None:
    cfg = load_config(None, ["loss.kl_beta=0", "loss.overlong_filter=true", "trainer.device=cpu"])
    engine = HFEngine(cfg, model_path, rank, world)
    batch = shaped_batch(engine.model.config.vocab_size, [(3, 5), (6, 2)], seed=0)
    batch.loss_mask = np.zeros(len(batch), np.float32)  # both completions cut at max_tokens
    engine.train_step(batch)


def test_a_batch_whose_rows_are_all_masked_stops_the_job(tiny):
    with pytest.raises(FatalError, match="every row of this batch.*loss.overlong_filter=false"):
        launch(1, functools.partial(_masked_step, str(tiny)))
