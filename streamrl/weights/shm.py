"""`shm` backend: versions in same-host shared memory, /dev/shm/streamrl-<run>-<run key>/v<version>/.

The default for one machine: the trainer writes into tmpfs, a generator's `fetch` is a hard
link (no copy), and the link keeps the bytes alive even after the publisher collects the
version. Every role must run on the same host; use `weights.backend=dir` across hosts.
The directory is keyed by the run directory, so two jobs of the same `run.name` on one host
never share (or delete) each other's weights; `streamrl up` removes it at exit.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from streamrl.config.schema import Config
from streamrl.core.broker import Broker, Keys
from streamrl.weights.files import FileLoader, FilePublisher
from streamrl.weights.store import WeightHandle


def shm_root(run: str, run_dir: Path | None) -> Path:
    """This run's host-local folder: /dev/shm/streamrl-<run>-<hash of the run dir> (the temp dir
    where the host has no /dev/shm, e.g. macOS). A process without a run dir (a worker started by
    hand without --run-dir) falls back to /dev/shm/streamrl-<run>."""
    base = Path("/dev/shm")
    if not (base.is_dir() and os.access(base, os.W_OK)):
        base = Path(tempfile.gettempdir())
    if run_dir is None:
        return base / f"streamrl-{run}"
    key = hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:12]
    return base / f"streamrl-{run}-{key}"


class ShmPublisher(FilePublisher):
    transport = "shm"

    @classmethod
    def from_config(cls, cfg: Config, broker: Broker, run_dir: Path | None) -> "ShmPublisher":
        root = shm_root(cfg.run.name, run_dir)
        return cls(broker, Keys.of(cfg), cfg.weights.keep, root=root, cache_root=root)


class ShmLoader(FileLoader):
    transport = "shm"

    @classmethod
    def from_config(cls, cfg: Config, broker: Broker, run_dir: Path | None) -> "ShmLoader":
        return cls(broker, Keys.of(cfg), cache_root=shm_root(cfg.run.name, run_dir))

    def _fetch(self, handle: WeightHandle) -> str:
        # Link next to the published version, whatever run dir this reader was given: the same tmpfs
        # by construction, and the publisher's gc and `up`'s cleanup of its root cover the links too.
        self.cache_root = Path(handle.handle).parent
        self.cache_dir = self.cache_root / f"fetched-{os.getpid()}"
        return super()._fetch(handle)

    def _materialise(self, src: Path, dst: Path) -> None:
        os.link(src, dst)  # same filesystem by construction (cache_root is the publisher's root)
