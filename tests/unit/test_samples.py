"""samples.jsonl rows from a batch, `streamrl samples` and the report's samples.html (pure, files only).

pytest tests/unit/test_samples.py -q
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from streamrl.commands import samples as samples_cmd
from streamrl.core.batch import Batch
from streamrl.core.errors import ConfigError
from streamrl.core.messages import Rollout
from streamrl.report.samples_html import samples_page
from streamrl.train.samples import format_sample, read_samples, sample_rows, turns


def _rollout(gid: str, sample: int, text: str = "the answer is 4", meta=None) -> Rollout:
    return Rollout(
        rollout_id=f"{gid}:{sample}:t0",
        group_id=gid,
        sample=sample,
        group_size=2,
        prompt_ids=np.array([1, 2]),
        completion_ids=np.array([3, 4, 5]),
        logprobs=np.zeros(3),
        version=1,
        version_switches=[[2, 2]],
        finish_reason="stop",
        text=text,
        prompt_text="What is 2+2?",
        meta=meta or {},
    )


def _batch() -> Batch:
    episode = {"turn_chars": [5, 4, 3]}  # model "call(", env "obs ", model "end"
    rollouts = [_rollout("g0", 0), _rollout("g0", 1), _rollout("g1", 0, "call(obs end", episode), _rollout("g1", 1)]
    return Batch(
        rollouts=rollouts,
        group_index=np.array([0, 0, 1, 1]),
        rewards=np.array([1.0, 0.0, 0.5, 0.5], np.float32),
        advantages=np.array([1.0, -1.0, 0.0, 0.0], np.float32),
        ref_logprobs=None,
        staleness=np.array([2, 2, 3, 3]),
        reward_components={"reward/math": np.array([1.0, 0.0, 0.0, 1.0])},
    )


def test_rows_spread_over_groups_and_carry_what_a_reader_needs():
    rows = sample_rows(_batch(), step=3, n=2)
    assert [(r["group_id"], r["sample"]) for r in rows] == [("g0", 0), ("g1", 0)]  # one per group first
    first = rows[0]
    assert first["prompt"] == "What is 2+2?" and first["completion"] == "the answer is 4"
    assert first["reward"] == 1.0 and first["reward_components"] == {"reward/math": 1.0}
    assert (first["step"], first["version"], first["staleness"], first["tokens"]) == (3, 1, 2, 3)
    assert rows[1]["turns"] == [
        {"role": "model", "text": "call("},
        {"role": "env", "text": "obs "},
        {"role": "model", "text": "end"},
    ]
    assert "turns" not in first
    assert len(sample_rows(_batch(), 3, 10)) == 4 and sample_rows(_batch(), 3, 0) == []


def test_turns_of_a_single_turn_completion_are_none():
    assert turns("abc", None) == [] and turns("abc", []) == []


def _write(tmp_path, rows):
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_samples_command_prints_one_step(tmp_path, capsys):
    _write(tmp_path, sample_rows(_batch(), 1, 1) + sample_rows(_batch(), 2, 2))
    assert [r["step"] for r in read_samples(tmp_path, 2)] == [2, 2]
    assert samples_cmd.run(SimpleNamespace(run_dir=str(tmp_path), step=2, last=None, json=False)) == 0
    out = capsys.readouterr().out
    assert out.count("step 2  group") == 2 and "step 1  group" not in out
    assert "What is 2+2?" in out and "env: obs" in out and "reward/math=1" in out
    with pytest.raises(ConfigError, match="has steps 1..2"):
        samples_cmd.run(SimpleNamespace(run_dir=str(tmp_path), step=9, last=None, json=False))


def test_samples_command_names_the_fix_without_a_file(tmp_path):
    with pytest.raises(ConfigError, match="samples_per_step"):
        samples_cmd.run(SimpleNamespace(run_dir=str(tmp_path), step=None, last=None, json=False))


def test_html_page_escapes_and_groups_by_step():
    rows = sample_rows(_batch(), 1, 2)
    rows[0]["completion"] = "<script>x</script>"
    page = samples_page(rows, "samples of run")
    assert '<h2 id="step-1">step 1</h2>' in page and page.count('class="s"') == 2
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "staleness 2" in page and "<b>env</b>" in page
    assert "No samples" in samples_page([], "x")


def test_format_sample_is_one_readable_block():
    text = format_sample(sample_rows(_batch(), 4, 1)[0])
    assert text.startswith("step 4  group g0 #0  reward 1 (reward/math=1)  version 1  staleness 2")


def test_a_judges_reply_is_kept_in_the_row_and_follows_the_rows_of_a_micro_batch():
    batch = _batch()
    batch.annotation_texts = {"judge": ["7", "", "2 - short", "9"]}
    rows = sample_rows(batch, 1, 4, {"reward": 0.0, "judge": 0.1})
    assert [r.get("annotation_texts") for r in rows] == [{"judge": "7"}, None, {"judge": "2 - short"}, {"judge": "9"}]
    assert rows[0]["reward_weights"] == {"reward": 0.0, "judge": 0.1}
    assert batch.select([2, 0]).annotation_texts == {"judge": ["2 - short", "7"]}
    assert batch.shard(1, 2).annotation_texts == {"judge": ["2 - short", "9"]}
    assert "<b>judge said</b><pre>7</pre>" in samples_page(rows, "x")  # the report's page shows it too
