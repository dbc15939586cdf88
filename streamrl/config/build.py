"""Configs built in Python (the API, `streamrl.load_config`): a preset name, a YAML file, an existing
Config or the default, then whole sections as keywords, then dotted overrides; validated once, with
the CLI's errors (streamrl/config/files.py). A function or class where a config names user code
(reward.fn, env.fn) is recorded by the spec every role imports (streamrl.core.imports.spec_of).

    cfg = make_config("tiny-cpu", {"trainer.steps": 4}, reward={"fn": score})
    cfg = make_config("configs/gsm8k-gpu.yaml", ["trainer.steps=20", "loss.name=gspo"])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from pydantic import BaseModel

from streamrl.config.files import DEFAULT_CONFIG, apply_overrides, read_config_file, set_dotted, validate_config
from streamrl.config.schema import Config
from streamrl.core.errors import ConfigError

PRESETS = DEFAULT_CONFIG.parent
"""The configs/ folder: a preset is the name of one of its YAML files (`tiny-cpu` -> configs/tiny-cpu.yaml)."""


def presets() -> list[str]:
    """The preset names (configs/*.yaml without the suffix)."""
    return sorted(p.stem for p in PRESETS.glob("*.yaml"))


def source_data(source: Config | Mapping | str | Path | None) -> tuple[dict, str]:
    """The sections of `source` (not validated) and how errors name it. A string is a path when it names
    a file or ends in .yaml/.yml, else a preset name."""
    if source is None:
        return read_config_file(DEFAULT_CONFIG), str(DEFAULT_CONFIG)
    if isinstance(source, Config):
        return source.model_dump(exclude_unset=True), "the given Config"
    if isinstance(source, Mapping):
        return _plain(source), "the given mapping"
    path = Path(source).expanduser()
    if path.is_file() or path.suffix in (".yaml", ".yml") or path.is_dir():
        path = path / "config.yaml" if path.is_dir() else path  # a run directory: the config its job wrote
        return read_config_file(path), str(path)
    preset = PRESETS / f"{source}.yaml"
    if not preset.is_file():
        raise ConfigError(
            f"config {source!r} is neither a YAML file nor a preset; give a path to a .yaml file or one of "
            f"the presets in {PRESETS}: {', '.join(presets())}"
        )
    return read_config_file(preset), str(preset)


def make_config(
    source: Config | Mapping | str | Path | None = None,
    overrides: Mapping[str, Any] | list[str] | None = None,
    **sections: Mapping[str, Any] | BaseModel,
) -> Config:
    """The validated Config of `source` (make_config's doc above) with `sections` merged in (each a dict or
    a section model: the keys it sets replace the source's) and `overrides` applied last: a mapping
    `{"trainer.steps": 4}` (values as they are) or `["trainer.steps=4"]` strings (YAML scalars, as --set)."""
    data, where = source_data(source)
    for name, section in sections.items():
        if name not in Config.model_fields:
            raise ConfigError(
                f"make_config got the keyword {name}=..., which is not a config section; sections: "
                f"{', '.join(Config.model_fields)}"
            )
        value = section.model_dump(exclude_unset=True) if isinstance(section, BaseModel) else section
        if isinstance(value, Mapping) and isinstance(data.get(name), dict):
            data[name] = _merge(data[name], value)
        else:
            data[name] = _plain(value) if isinstance(value, Mapping) else value
    blamed: list[str] = []
    if isinstance(overrides, Mapping):
        for dotted, value in overrides.items():
            set_dotted(data, dotted, value, f"override {dotted!r}")
            blamed.append(f"{dotted}={value}")
    elif overrides:
        overrides = [overrides] if isinstance(overrides, str) else list(overrides)
        data = apply_overrides(data, overrides)
        blamed = overrides
    return validate_config(data, where, blamed)


def _plain(value: Mapping) -> dict:
    return {k: _plain(v) if isinstance(v, Mapping) else v for k, v in value.items()}


def _merge(base: dict, extra: Mapping) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = _plain(value) if isinstance(value, Mapping) else value
    return out
