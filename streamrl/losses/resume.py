"""A resumed run whose objective changes takes the new objective's defaults, and says so.

    cfg, note = switch_objective(run_dir / "config.yaml", cfg, overrides)   # `up --resume RUN --set loss.name=dapo`

RUN_DIR/config.yaml holds the loss section resolved for the run's objective (every default written
out), so re-reading it with another `loss.name` would run the new objective with the old one's
values (grpo's eps_high 0.2 and no dynamic sampling under dapo). A written value equal to the old
objective's default is taken as that default and gives way to the new objective's; a value that
differs was chosen by the user and is kept where the new objective has that setting (and does not
fix another value); `--set loss.*` given now wins. The note lists each change for the console.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from streamrl.config.schema import Config, LossConfig


def _fmt(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def switch_objective(written_path: Path, cfg: Config, overrides: list[str]) -> tuple[Config, str | None]:
    """`cfg` (RUN_DIR/config.yaml plus this command's --set) with its loss section rebuilt for a new
    objective, and the console note; unchanged (note None) when the objective is the run's."""
    from streamrl.losses.registry import get_objective, loss_settings  # imports the objective modules

    written = (yaml.safe_load(Path(written_path).read_text()) or {}).get("loss") or {}
    old, new = written.get("name", LossConfig().name), cfg.loss.name
    if old == new:
        return cfg, None
    old_defaults = loss_settings(LossConfig(name=old)).model_dump(mode="json")
    cls = get_objective(new).settings
    given = {o.split("=", 1)[0].strip().removeprefix("loss.") for o in overrides if o.strip().startswith("loss.")}
    current = cfg.loss.model_dump(mode="json")
    data: dict[str, Any] = {"name": new, **{k: current[k] for k in given if k in current and k != "name"}}
    defaulted, kept, dropped = [], [], []
    for key, value in written.items():
        if key == "name" or key in given:
            continue
        if key in old_defaults and value == old_defaults[key]:
            defaulted.append(key)
        elif key not in cls.model_fields or key in cls.fixed and cls.fixed[key] != value:
            dropped.append(f"{key}={_fmt(value)}")
        else:
            data[key] = value
            kept.append(f"{key}={_fmt(value)}")
    loss = LossConfig(**data)
    resolved = loss_settings(loss).model_dump(mode="json")
    changed = [
        f"{k} {_fmt(written[k])} -> {_fmt(resolved[k])}" for k in defaulted if resolved.get(k, written[k]) != written[k]
    ]
    note = (
        f"resume: loss.name {old} -> {new}: {new}'s own defaults replace {old}'s"
        + (f" ({', '.join(changed)})" if changed else " (no value changes)")
        + (f"; kept your {', '.join(kept)}" if kept else "")
        + (f"; dropped {', '.join(dropped)} (not a {new} setting, or one {new} fixes)" if dropped else "")
        + (f"; from --set: {', '.join(sorted(given - {'name'}))}" if given - {"name"} else "")
    )
    return cfg.model_copy(update={"loss": loss}), note
