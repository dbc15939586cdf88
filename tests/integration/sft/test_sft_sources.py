"""SFT data sources built offline: jsonl, parquet, a `datasets` Dataset / DatasetDict saved to disk
(with an eval split), chat rows through columnar formats; bad rows are skipped and counted; a data
error stops `streamrl sft` before any rank starts; two FSDP ranks train the same step as one.

    pytest tests/integration/sft/test_sft_sources.py
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from streamrl.config.schema import SFTConfig, TaskConfig, TinyModelConfig
from streamrl.core.errors import ConfigError
from streamrl.models.tiny import build_tiny_model, build_tokenizer
from streamrl.sft.data import load_splits, tokenize_row
from tests.unit.test_sft_data import CONVERSATION, QWEN_STYLE, TOOLS

ROWS = [{"prompt": f"p{i}:", "completion": "x" * (i % 5 + 1)} for i in range(20)]


def test_jsonl_and_parquet_give_the_same_rows_and_hold_out_eval(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "d.parquet")
    got = {}
    for name in ("d.jsonl", "d.parquet"):
        train, held = load_splits(SFTConfig(data=str(tmp_path / name), eval_fraction=0.25), TaskConfig(), seed=0)
        got[name] = ([train[i] for i in range(len(train))], [held[i] for i in range(len(held))])
        assert len(train) == 15 and len(held) == 5
        assert not {r["prompt"] for r in got[name][0]} & {r["prompt"] for r in got[name][1]}
    assert got["d.jsonl"] == got["d.parquet"]


def test_datasets_saved_to_disk_with_splits_and_chat_rows(tmp_path):
    import datasets

    chat = {"messages": [{**m, "tool_calls": m.get("tool_calls")} for m in CONVERSATION], "tools": json.dumps(TOOLS)}
    dd = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list([chat] * 6), "test": datasets.Dataset.from_list([chat] * 2)}
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    train, held = load_splits(SFTConfig(data=str(tmp_path / "dd"), eval_split="test"), TaskConfig(), seed=0)
    assert (len(train), len(held)) == (6, 2)
    tok = build_tokenizer()
    tok.chat_template = QWEN_STYLE
    # Arrow turns the messages into structs with every key (None where absent): same tokens as the dicts.
    want = tokenize_row(tok, {"messages": CONVERSATION, "tools": TOOLS}, SFTConfig())
    got = tokenize_row(tok, train[0], SFTConfig())
    assert got.ids.tolist() == want.ids.tolist() and got.mask.tolist() == want.mask.tolist()
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "one"))
    train, held = load_splits(SFTConfig(data=str(tmp_path / "one"), eval_fraction=0.1), TaskConfig(), seed=0)
    assert (len(train), len(held)) == (18, 2)
    with pytest.raises(ConfigError, match="has splits \\['test', 'train'\\], not 'validation'"):
        load_splits(SFTConfig(data=str(tmp_path / "dd"), eval_split="validation"), TaskConfig(), seed=0)


def test_load_dataset_with_data_files(tmp_path):
    (tmp_path / "a.json").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    train, _ = load_splits(
        SFTConfig(data="json", data_files=str(tmp_path / "a.json"), eval_fraction=0), TaskConfig(), seed=0
    )
    assert len(train) == 20 and train[3] == ROWS[3]


def test_source_errors_name_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_splits(SFTConfig(data=str(tmp_path / "nope.jsonl")), TaskConfig(), seed=0)
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a", "completion": "b"}\nnot json\n')
    with pytest.raises(ConfigError, match="bad.jsonl:2: not valid JSON"):
        load_splits(SFTConfig(data=str(tmp_path / "bad.jsonl")), TaskConfig(), seed=0)
    with pytest.raises(ConfigError, match="needs a `datasets` source"):
        load_splits(SFTConfig(data="charclass", eval_split="test"), TaskConfig(), seed=0)


def test_cli_reports_a_data_error_before_starting(tmp_path, capsys):
    from streamrl.cli import main

    code = main(["sft", "--set", f"sft.data={tmp_path / 'nope.jsonl'}", "--run-dir", str(tmp_path / "run")])
    assert code == 2 and "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def _first_step(cfg, out: str, rank: int, world: int) -> None:
    from workers.sft import SFTRun

    run = SFTRun(cfg, Path(out).parent, rank, world)
    m = run.step(0)
    if rank == 0:
        Path(out).write_text(json.dumps({**m, **run.counts}))


def test_two_ranks_train_the_same_step_as_one_and_skip_bad_rows(tmp_path):
    from streamrl.config.schema import Config
    from streamrl.train.dist import launch

    tiny = build_tiny_model(TinyModelConfig(init_std=0.2), tmp_path / "tiny", seed=0)
    rows = ROWS + [{"question": "no prompt/completion"}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = Config.model_validate(
        {
            "model": {"path": str(tiny)},
            "sft": {
                "data": str(tmp_path / "d.jsonl"),
                "batch_size": 21,
                "eval_fraction": 0,
                "micro_batch_tokens": 32,
                "max_seq_len": 16,
            },
        }
    )
    got = {}
    for world in (1, 2):
        cfg.trainer.world_size = world
        out = tmp_path / f"w{world}.json"
        launch(world, functools.partial(_first_step, cfg, str(out)))
        got[world] = json.loads(out.read_text())
    assert got[1]["loss_tokens"] == got[2]["loss_tokens"] == sum(len(r["completion"]) + 1 for r in ROWS)
    assert got[1]["loss"] == pytest.approx(got[2]["loss"], rel=1e-5)
    assert got[1]["grad_norm"] == pytest.approx(got[2]["grad_norm"], rel=1e-5)
    assert got[1]["skipped_rows"] == 1  # the row without prompt/completion, counted, not fatal
