"""Where streamrl keeps what it can rebuild: tiny models, preflight's remembered checks.

cache_dir() / "models"      # STREAMRL_CACHE, default ~/.cache/streamrl
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("STREAMRL_CACHE", Path.home() / ".cache" / "streamrl"))
