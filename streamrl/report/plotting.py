"""matplotlib for `streamrl report` and the benchmarks' figures (bench/ imports it from here).

plt = pyplot()      # ConfigError naming the extra to install when matplotlib is missing
"""

from __future__ import annotations

from streamrl.core.errors import ConfigError


def pyplot():
    """matplotlib's pyplot on the file-only backend; a clear error naming the extra when missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("plots need matplotlib: pip install -e '.[bench]' (or pip install matplotlib)") from None
    return plt
