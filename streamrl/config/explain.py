"""`streamrl config --explain`: every field of a config with its value and its description (the
field's docstring in streamrl/config/*.py, or an objective's in streamrl/losses/*.py), as YAML
comments, so the settings can be found without reading the schema.

    print(explain(resolved_dump(cfg), cfg))
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from pydantic import BaseModel


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


def explain(data: dict, cfg: BaseModel, loss: BaseModel | None = None, notes: dict[str, str] | None = None) -> str:
    """`data` (a dump of `cfg`) as YAML lines, each field followed by its description; `loss`: the
    resolved loss settings, whose class documents the objective's own fields; `notes`: dotted field
    name -> what it resolves to on this machine, put before the field's description."""
    lines, notes = [], notes or {}
    for key, value in data.items():
        section = loss if key == "loss" and loss is not None else getattr(cfg, key)
        doc = " ".join((type(cfg).model_fields[key].description or "").split())
        if not isinstance(section, BaseModel):  # an optional section left out (judge: null)
            lines.append(f"{key}: {_value(value)}" + (f"  # {doc}" if doc else ""))
            continue
        lines.append(f"{key}:" + (f"  # {doc}" if doc else ""))
        lines.extend(_lines(section, value, 1, f"{key}.", notes))
    return "\n".join(lines) + "\n"
