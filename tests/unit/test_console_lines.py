"""The console a user reads (issue 43, item 7): a short step line by default with an ETA, the full one
with --verbose and always in RUN_DIR/logs/steps.log; `streamrl samples` rounds its numbers, says how a
judged reward was summed and which tools an episode called, and ends quietly when its reader does
(`| head`); where the W&B / TensorBoard sinks wrote; no transformers progress bars.

    pytest tests/unit/test_console_lines.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from streamrl.commands.samples import tools_called
from streamrl.config.files import load_config
from streamrl.core.progress_bars import quiet_progress_bars
from streamrl.launch.progress import Progress, duration, step_line
from streamrl.train.samples import format_sample
from streamrl.train.sink_paths import sink_lines

ROOT = Path(__file__).resolve().parents[2]


def _row(step: int, time_s: float, **extra) -> dict:
    base = {"step": step, "reward_mean": 0.25, "staleness_max": 1, "samples": 64, "tokens": 4000}
    return {
        **base,
        "wait_s": 0.5,
        "train_s": 1.5,
        "time_s": time_s,
        "gen_busy": 0.9,
        "gen_tokens_per_s": 900.0,
        **extra,
    }


def test_the_default_step_line_is_short_and_the_full_one_is_verbose_and_logged(tmp_path):
    row = _row(3, 30.0, loss=0.0123, kl=0.0031, entropy=1.42, grad_norm=0.87, mfu=0.2)
    short, full = step_line(row, 60), step_line(row, 60, verbose=True)
    assert short == (
        "step    3/60 | reward 0.250 | loss 0.0123 kl 0.0031 ent 1.42 gnorm 0.87 | staleness 1 "
        "| 2,000 trained tok/s | elapsed 30s"
    )
    assert len(short) <= 140 and "busy" not in short and "t=" not in short
    assert "generators 900 tok/s, busy 90% of the time" in full and "64 samples, 4000 tokens" in full
    said: list[str] = []
    p = Progress(60, said.append, log_path=tmp_path / "steps.log")
    p.show([_row(1, 10.0), _row(2, 14.0), _row(3, 18.0)])
    assert said[0].endswith("elapsed 10s") and said[2].endswith("elapsed 18s, ETA 3m48s")  # 4 s a step, 57 left
    logged = (tmp_path / "steps.log").read_text().splitlines()
    assert len(logged) == 3 and "busy 90% of the time" in logged[2] and "ETA 3m48s" in logged[2]
    loud: list[str] = []
    Progress(60, loud.append, verbose=True).show([_row(1, 10.0)])
    assert "generators 900 tok/s" in loud[0]
    assert (duration(45), duration(192), duration(3900)) == ("45s", "3m12s", "1h05m")


def _judged(**extra) -> dict:
    return {
        "step": 2, "group_id": "g1", "sample": 0, "prompt": "p", "completion": "c", "version": 1, "staleness": 0,
        "tokens": 3, "finish_reason": "stop", "reward": 0.012500000186264515,
        "reward_components": {"reward": 0.5625, "judge": 0.1125}, **extra,
    }  # fmt: skip


def test_a_sample_header_rounds_and_says_how_a_judged_reward_was_summed():
    text = format_sample(_judged(reward_weights={"reward": 0.0, "judge": 0.1111111}))
    assert "reward 0.0125 = 0 x reward 0.562 + 0.111 x judge 0.113  version 1" in text
    assert "reward 0.0125 (reward=0.562, judge=0.113)" in format_sample(_judged())  # an older row: no weights
    plain = {**_judged(reward_components={"reward": 0.5}), "reward": 0.5, "reward_weights": {"reward": 1.0}}
    assert "reward 0.5 (reward=0.5)" in format_sample(plain)


def test_an_episode_says_which_tools_it_called():
    call = '<tool_call>{"name": "python", "arguments": {"code": "1+1"}}</tool_call>'
    row = {"turns": [{"role": "model", "text": call}, {"role": "env", "text": "2"},
                     {"role": "model", "text": call}, {"role": "env", "text": "2"},
                     {"role": "model", "text": "4"}]}  # fmt: skip
    assert tools_called(row, None) == ["python x2"]
    untagged = {
        "turns": [{"role": "model", "text": "1+1"}, {"role": "env", "text": "2"}, {"role": "model", "text": "4"}]
    }
    assert tools_called(untagged, "python") == ["python"] and tools_called(untagged, None) == []
    assert "tools called: python x2" in format_sample({**_judged(), "turns": row["turns"], "tool_calls": ["python x2"]})


def test_samples_into_head_ends_without_a_traceback(tmp_path):
    rows = [_judged(step=s) for s in range(1, 400)]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = f"{sys.executable} -m streamrl.cli samples {tmp_path} | head -n 2"
    out = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr
    assert out.stdout.startswith("step 1  group g1 #0  reward 0.0125 ")


def test_up_says_where_the_sinks_wrote_and_how_to_sync(tmp_path):
    cfg = load_config(None, ["metrics.sinks=[wandb, tensorboard]"])
    wandb, tb = sink_lines(cfg, tmp_path)
    assert wandb == f"W&B (offline): {tmp_path / 'wandb'}; upload with `wandb sync {tmp_path / 'wandb'}/offline-run-*`"
    assert tb == f"TensorBoard: {tmp_path / 'tensorboard'}; view with `tensorboard --logdir {tmp_path / 'tensorboard'}`"
    assert sink_lines(load_config(None), tmp_path) == []


def test_progress_bars_are_off_for_up_and_sft_and_the_roles_they_start(monkeypatch):
    from transformers.utils import logging

    hub_tqdm = sys.modules["huggingface_hub.utils.tqdm"]  # the module (the package attribute is the class)

    # Both libraries' switches come back as they were after this test (monkeypatch undoes these).
    monkeypatch.setattr(logging, "_tqdm_active", True)
    monkeypatch.setattr(hub_tqdm, "progress_bar_states", dict(hub_tqdm.progress_bar_states))
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")
    quiet_progress_bars()  # a user who wants them keeps them
    assert logging.is_progress_bar_enabled()
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS")
    quiet_progress_bars()
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"  # inherited by every role
    assert not logging.is_progress_bar_enabled()


def test_the_judges_reply_travels_to_the_samples():
    from streamrl.assemble.group_rewards import annotation_texts
    from streamrl.core.messages import Annotation, decode, encode

    sent = Annotation(rollout_id="g0:0:t0", key="judge", value=3.0, text="3 - it is mostly lowercase")
    assert decode(encode(sent)).text == "3 - it is mostly lowercase"  # on the wire (docs/protocol.md)
    joined = [
        {"reward": ("1-0", Annotation("g0:0", "reward", 0.5)), "judge": ("1-1", sent)},
        {"reward": ("1-2", Annotation("g0:1", "reward", 0.5))},  # its judge annotation timed out
    ]
    assert annotation_texts(joined) == {"judge": ["3 - it is mostly lowercase", ""]}
    assert annotation_texts([{"reward": ("1-0", Annotation("g0:0", "reward", 0.5))}]) == {}
    row = {**_judged(), "annotation_texts": {"judge": "3 - it is mostly lowercase"}}
    assert format_sample(row).endswith("  completion: c\n  judge said: 3 - it is mostly lowercase")
