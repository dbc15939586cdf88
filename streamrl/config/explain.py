"""`streamrl config --explain`: every field of a config with its value and its description (the
field's docstring in streamrl/config/*.py, or an objective's in streamrl/losses/*.py), as YAML
comments, so the settings can be found without reading the schema.

    print(explain(resolved_dump(cfg), cfg))
"""

from __future__ import annotations

import difflib
import json
from typing import Any, get_args

import yaml
from pydantic import BaseModel

from streamrl.core.errors import ConfigError


def _value(v: Any) -> str:
    if isinstance(v, str) and "\n" in v:
        return json.dumps(v)  # one line (a YAML double-quoted string), so the comment stays on it
    return yaml.safe_dump(v, default_flow_style=True, width=10**6).strip().removesuffix("\n...").strip()


def _lines(model: BaseModel, data: dict, indent: int, where: str, notes: dict[str, str]) -> list[str]:
    out, pad = [], "  " * indent
    fields = type(model).model_fields
    for key, value in data.items():
        field = fields.get(key)
        doc = " ".join((field.description or "").split()) if field else ""
        sub = getattr(model, key, None)
        if isinstance(sub, BaseModel) and isinstance(value, dict):
            out.append(f"{pad}{key}:" + (f"  # {doc}" if doc else ""))
            out.extend(_lines(sub, value, indent + 1, f"{where}{key}.", notes))
            continue
        line = f"{pad}{key}: {_value(value)}"
        if note := notes.get(f"{where}{key}"):
            doc = f"[{note}] {doc}"
        if doc:
            line += f"  # {doc}"
        out.append(line)
    return out


def _optional_section(annotation: Any) -> type[BaseModel] | None:
    """The section class of an optional section's annotation (`JudgeConfig | None` -> JudgeConfig)."""
    found = [a for a in get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
    return found[0] if found else None


def pick_sections(cfg: BaseModel, sections: list[str]) -> list[str]:
    """The top-level sections `--explain SECTION ...` names, checked (a misspelled one gets "did you mean")."""
    known = list(type(cfg).model_fields)
    for name in sections:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ConfigError(
                f"--explain {name}: no such config section; {hint}sections: {', '.join(known)} "
                "(or --explain alone for all)"
            )
    return sections or known


def explain(
    data: dict,
    cfg: BaseModel,
    loss: BaseModel | None = None,
    notes: dict[str, str] | None = None,
    sections: list[str] | None = None,
) -> str:
    """`data` (a dump of `cfg`) as YAML lines, each field followed by its description; `loss`: the
    resolved loss settings, whose class documents the objective's own fields; `notes`: dotted field
    name -> what it resolves to on this machine, put before the field's description; `sections`: only
    these top-level sections (None or empty: all). An optional section left out (judge: null) lists its
    fields with their defaults as comments, so they can be found before it is set."""
    lines, notes = [], notes or {}
    for key in pick_sections(cfg, sections or []):
        value = data[key]
        section = loss if key == "loss" and loss is not None else getattr(cfg, key)
        doc = " ".join((type(cfg).model_fields[key].description or "").split())
        if not isinstance(section, BaseModel):  # an optional section left out (judge: null)
            lines.append(f"{key}: {_value(value)}" + (f"  # {doc}" if doc else ""))
            if (kind := _optional_section(type(cfg).model_fields[key].annotation)) is not None:
                unset = kind.model_construct()  # its defaults, unvalidated: a required field shows as its default
                lines.append(f"#   unset; its fields and their defaults (set one: --set {key}.FIELD=VALUE):")
                lines.extend(f"# {line}" for line in _lines(unset, unset.model_dump(mode="json"), 1, f"{key}.", notes))
            continue
        lines.append(f"{key}:" + (f"  # {doc}" if doc else ""))
        lines.extend(_lines(section, value, 1, f"{key}.", notes))
    return "\n".join(lines) + "\n"
