"""docs/protocol.md's "Episode checkpoints" names exactly the fields of the EpisodeState wire type."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from streamrl.core.messages import EpisodeState

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def test_documented_episode_state_fields_are_the_wire_type_fields():
    text = DOC.read_text()
    start = text.index("**Episode checkpoints**")
    paragraph = text[start : text.index("\n- ", start)]
    listed = paragraph[paragraph.index('`"episode_state"`') :]
    documented = set(re.findall(r"`([a-z_]+)`", listed))
    wire = {f.name for f in fields(EpisodeState)}
    assert wire <= documented, f"fields missing from docs/protocol.md: {sorted(wire - documented)}"
    unknown = {n for n in documented - wire if n not in {"schema", "kind", "replay", "error_kind"}}
    assert not unknown, f"docs/protocol.md names fields the wire type lacks: {sorted(unknown)}"
