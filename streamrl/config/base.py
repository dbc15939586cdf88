"""The base of every config section: pydantic, unknown keys rejected, assignments validated."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    # use_attribute_docstrings: each field's docstring is its description (`streamrl config --explain`).
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)
