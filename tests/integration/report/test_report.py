"""`streamrl report`: the summary arithmetic and the PNGs, from a run directory written the way the
trainer (MetricsWriter) and the roles' structured logs write it.

    pytest tests/integration/report/test_report.py
"""

from __future__ import annotations

import json

import pytest

from bench.common import pyplot
from streamrl.cli import main
from streamrl.report.figures import LOSS_KEYS, losses_figure, staleness_figure
from streamrl.report.summary import summarize
from streamrl.train.metrics import MetricsWriter


def _run_dir(tmp_path):
    w = MetricsWriter(tmp_path)
    for step in (1, 2, 3):
        w.write(
            {
                "step": step,
                "reward_mean": 0.1 * step,
                "reward_std": 0.05,
                "samples": 8,
                "tokens": 100,
                "staleness_hist": {"0": 4, "1": 4},
                "staleness_hist_tokens": {"0": 50, "1": 50},
                "wait_s": 10.0 if step == 1 else 0.5,
                "train_s": 1.5,
                "publish_stall_s": 0.0,
                "overlap_frac": 0.5,
                "loss": 0.2 / step,
                "kl": 0.01,
                "mismatch_kl_s0": 0.001 * step,
                "mismatch_ratio_max_s0": 1.0 + step,
                "mismatch_tokens_s0": 50,
            }
        )
    w.close()
    logs = tmp_path / "logs"
    logs.mkdir()
    gen = [
        {"event": "engine_started", "seconds": 4.0, "role": "generator", "worker_id": "generator-0"},
        {"event": "weights_loaded", "switch_latency_s": 0.1, "paused_s": 0.02, "joining": False},
        {"event": "weights_loaded", "switch_latency_s": 0.3, "paused_s": 0.04, "joining": False},
        {"event": "weights_loaded", "switch_latency_s": 9.0, "paused_s": 0.04, "joining": True},
        {
            "event": "stopped",
            "role": "generator",
            "worker_id": "generator-0",
            "busy_fraction": 0.7,
            "tokens_generated": 600,
            "uptime_s": 10.0,
        },
    ]
    (logs / "generator-0.jsonl").write_text("\n".join(json.dumps(g) for g in gen) + "\n{cut by a crash")
    return tmp_path


def test_summary_skips_the_start_up_step(tmp_path):
    s = summarize(_run_dir(tmp_path))
    assert s["steps"] == 3 and s["trained_tokens"] == 300
    assert s["trained_tokens_per_s"] == pytest.approx(200 / 4.0)  # steps 2-3: 2 x (0.5 + 1.5) s
    assert s["busy"] == {"generator:generator-0": 0.7, "trainer": 0.75}
    assert s["generated_tokens_per_s"] == pytest.approx(600 / 6.0)  # uptime minus engine start
    assert s["weight_sync_latency_s"] == {"p50": 0.2, "max": 0.3, "count": 2}  # the joining load is not a sync
    assert s["staleness_hist_tokens"] == {"0": 150, "1": 150}
    # steps 2-3: the mean KL, the largest ratio of any step
    assert s["mismatch"] == {"kl_s0": pytest.approx(0.0025), "ratio_max_s0": 4.0}


def test_report_command_writes_every_plot(tmp_path, capsys):
    run_dir = _run_dir(tmp_path)
    assert main(["report", str(run_dir), "--json"]) == 0
    assert sorted(p.name for p in (run_dir / "report").iterdir()) == [
        "busy.png",
        "losses.png",
        "reward.png",
        "staleness.png",
        "throughput.png",
    ]
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["steps"] == 3


def test_report_shows_the_optimisation_and_the_kept_samples(tmp_path, capsys):
    run_dir = _run_dir(tmp_path)
    row = {"step": 2, "group_id": "g0", "sample": 0, "prompt": "2+2?", "completion": "<b>4</b>", "reward": 1.0}
    row |= {"reward_components": {}, "version": 1, "staleness": 1, "finish_reason": "stop", "tokens": 3}
    (run_dir / "samples.jsonl").write_text(json.dumps(row) + "\n")
    assert main(["report", str(run_dir), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["loss"] == "0.2 -> 0.06667" and summary["kl"] == "0.01 -> 0.01"
    page = (run_dir / "report" / "samples.html").read_text()
    assert "step 2" in page and "&lt;b&gt;4&lt;/b&gt;" in page


def test_report_names_the_fix_without_metrics(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "has no metrics.jsonl" in capsys.readouterr().err


def test_losses_are_a_readable_grid():
    plt = pyplot()
    fig = losses_figure(plt, [{"step": s, **{k: 0.1 * s for k in LOSS_KEYS}} for s in range(1, 30)])
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in shown] == LOSS_KEYS
    width, height = fig.get_size_inches()
    assert width <= 15 and width / height <= 3  # one 24 x 3 in strip of 8 panels was unreadable
    plt.close(fig)


def test_staleness_ticks_are_whole_numbers():
    plt = pyplot()
    fig = staleness_figure(plt, {"0": 5, "1": 7})
    fig.canvas.draw()
    ax = fig.axes[0]
    assert all(float(t).is_integer() for t in ax.get_xticks()), ax.get_xticks()
    assert all(float(t).is_integer() for t in ax.get_yticks()), ax.get_yticks()
    plt.close(fig)


def test_report_shows_evaluation_during_training(tmp_path, capsys):
    w = MetricsWriter(tmp_path)
    for step in (1, 2, 3, 4):
        row = {"step": step, "reward_mean": 0.2, "samples": 8, "tokens": 100, "wait_s": 0.5, "train_s": 1.0}
        if step in (1, 3, 4):  # rounds of versions 0, 2 and 4 land in the next rows (the last: the final weights)
            v = {1: 0, 3: 2, 4: 4}[step]
            row.update(
                {
                    "eval/step": v,
                    "eval/pass@1": 0.1 * v,
                    "eval/pass@4": 0.2 * v,
                    "eval/mean@4": 0.15 * v,
                    "eval/maj@4": 0.05 * v,
                    "eval/prompts": 8,
                }
            )
        w.write(row)
    w.close()
    s = summarize(tmp_path)
    assert s["eval"]["eval/pass@1"] == {0: 0.0, 2: 0.2, 4: 0.4}
    assert set(s["eval"]) == {"eval/pass@1", "eval/pass@4", "eval/mean@4", "eval/maj@4"}
    assert main(["report", str(tmp_path)]) == 0
    assert (tmp_path / "report" / "eval.png").is_file()
    assert "eval/pass@1" in capsys.readouterr().out
