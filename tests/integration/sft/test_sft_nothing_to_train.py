"""An SFT run with nothing to train on is an error naming the fix, not a run at loss 0 that exits 0
(issue 26, defect 2): chat rows with a tokenizer without a chat template stop `streamrl sft` before
any rank starts; a step whose rows hold no loss token stops at that step.

    pytest tests/integration/sft/test_sft_nothing_to_train.py
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from streamrl.config.schema import Config, TinyModelConfig
from streamrl.models.tiny import build_tiny_model
from streamrl.train.dist import RankFailed, launch

CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


def test_chat_rows_without_a_chat_template_stop_before_training(tmp_path, capsys):
    from streamrl.cli import main

    (tmp_path / "chat.jsonl").write_text((json.dumps(CHAT) + "\n") * 2)
    run_dir = tmp_path / "run"
    code = main(["sft", "--set", f"sft.data={tmp_path / 'chat.jsonl'}", "--run-dir", str(run_dir)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "no chat template" in err and "model.tiny.chat_template=true" in err and "sft.assistant_turns" in err
    assert not run_dir.exists()  # refused before the run directory, the ranks or the model exist


def _first_step(cfg: Config, run_dir: str, rank: int, world: int) -> None:
    from workers.sft import SFTRun

    SFTRun(cfg, Path(run_dir), rank, world).step(0)


def test_a_step_without_loss_tokens_is_an_error(tmp_path):
    tiny = build_tiny_model(TinyModelConfig(), tmp_path / "tiny", seed=0)
    # Every row fails to tokenize, so the step's batch is empty on every rank.
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"question": f"q{i}"}) + "\n" for i in range(4)))
    cfg = Config.model_validate(
        {"model": {"path": str(tiny)}, "sft": {"data": str(tmp_path / "d.jsonl"), "batch_size": 4, "eval_fraction": 0}}
    )
    with pytest.raises(RankFailed, match="no loss token on any rank.*model.tiny.chat_template"):
        launch(1, functools.partial(_first_step, cfg, str(tmp_path)))
