"""Where the metric sinks of a run wrote (streamrl/train/sinks.py) and how to look at or upload it: the
lines `streamrl up` prints at the end, read from the config alone (no sink library imported).

    for line in sink_lines(cfg, run_dir): print(line)
    # W&B (offline): runs/x/wandb; upload with `wandb sync runs/x/wandb/offline-run-*`
"""

from __future__ import annotations

from pathlib import Path

from streamrl.config.schema import Config


def sink_lines(cfg: Config, run_dir: Path) -> list[str]:
    """One line per configured sink; [] with none; pure."""
    m, out = cfg.metrics, []
    if "wandb" in m.sinks:
        where = Path(run_dir) / "wandb"
        if m.wandb_mode == "offline":
            out.append(f"W&B (offline): {where}; upload with `wandb sync {where}/offline-run-*`")
        else:
            out.append(f"W&B (online): project {m.wandb_project!r} on your W&B server; local copy in {where}")
    if "tensorboard" in m.sinks:
        where = m.tensorboard_dir or str(Path(run_dir) / "tensorboard")
        out.append(f"TensorBoard: {where}; view with `tensorboard --logdir {where}`")
    if "prometheus" in m.sinks:
        out.append(
            f"Prometheus: served at http://{m.prometheus_addr}:{m.prometheus_port}/metrics while the trainer ran"
        )
    return out
