"""`shm` backend: versions in same-host shared memory, /dev/shm/streamrl-<run>/v<version>/.

The default for one machine: the trainer writes into tmpfs, a generator's `fetch` is a hard
link (no copy), and the link keeps the bytes alive even after the publisher collects the
version. Every role must run on the same host; use `weights.backend=dir` across hosts.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from streamrl.broker import Broker, Keys
from streamrl.config import Config
from streamrl.weightstores.files import FileWeightStore


def shm_root(run: str) -> Path:
    """/dev/shm/streamrl-<run> (the temp dir where the host has no /dev/shm, e.g. macOS)."""
    base = Path("/dev/shm")
    if not (base.is_dir() and os.access(base, os.W_OK)):
        base = Path(tempfile.gettempdir())
    return base / f"streamrl-{run}"


class ShmWeightStore(FileWeightStore):
    transport = "shm"

    @classmethod
    def from_config(cls, cfg: Config, broker: Broker, run_dir: Path | None) -> "ShmWeightStore":
        root = shm_root(cfg.run.name)
        return cls(broker, Keys(cfg.run.name), cfg.weights.keep, root=root, cache_root=root)

    def _materialise(self, src: Path, dst: Path) -> None:
        os.link(src, dst)  # same filesystem by construction (cache_root == root)
