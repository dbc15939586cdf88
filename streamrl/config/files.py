"""Config files: a YAML file plus `--set section.field=value` overrides, validated into a
`Config` (streamrl/config/schema.py) with errors that name the field and the fix; and the resolved
config (objective defaults applied) written back for every role of a run.

    cfg = load_config("configs/tiny-cpu.yaml", ["trainer.steps=20"])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from streamrl.config.schema import Config
from streamrl.core.errors import ConfigError

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.yaml"


def _parse_scalar(text: str) -> Any:
    return yaml.safe_load(text) if text.strip() else ""


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply `a.b=c` strings (values parsed as YAML scalars) to a nested dict."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r} is not of the form section.field=value, e.g. --set trainer.steps=20")
        dotted, value = item.split("=", 1)
        parts = dotted.strip().split(".")
        node = data
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {part!r} is a value, not a section")
        node[parts[-1]] = _parse_scalar(value)
    return data


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field; check the spelling against configs/tiny-cpu.yaml or run `streamrl config` to see every field"
        lines.append(f"  {where}: {msg}")
    return "\n".join(lines)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load and validate a config; raise ConfigError naming the field and the fix."""
    path = Path(path) if path else DEFAULT_CONFIG
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; pass --config configs/tiny-cpu.yaml")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections, got {type(data).__name__}")
    data = apply_overrides(data, overrides or [])
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, str(path))) from None


def resolved_dump(cfg: Config) -> dict:
    """The config as every role will read it: each field written out, and `loss:` resolved against
    its objective (streamrl.losses.resolve_loss: sapo's seq_mean, dapo's dynamic_sampling, the
    fixed horizon). Writing the plain dump instead would turn each objective default the user left
    alone into the shared default "set by the user" (gspo: aggregation=token_mean), which the
    objective then rejects or silently runs with; resolved, re-reading it resolves identically."""
    from streamrl.losses.registry import resolve_loss  # lazy: imports the objective (and torch)

    data = cfg.model_dump(mode="json")
    data["loss"] = resolve_loss(cfg).model_dump(mode="json")
    return data


def dump_config(cfg: Config, path: str | Path) -> None:
    """Write RUN_DIR/config.yaml: it means what `cfg` means wherever it is read (every role, every
    rank, `streamrl config --config`, `--resume`)."""
    Path(path).write_text(yaml.safe_dump(resolved_dump(cfg), sort_keys=False))
