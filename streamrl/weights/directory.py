"""`dir` backend: versions in a shared directory (NFS, a cluster filesystem) for multi-host runs.

The trainer writes cfg.weights.dir (default RUN_DIR/weights)/v<version>/model.safetensors with
fsync + rename; a generator's `fetch` copies the file to its host's /dev/shm first (its run's
folder, `shm_root`), so vLLM reloads from local memory and the publisher may collect the shared
copy at any time.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from streamrl.config.schema import Config
from streamrl.core.broker import Broker, Keys
from streamrl.core.errors import ConfigError
from streamrl.weights.files import FileLoader, FilePublisher
from streamrl.weights.shm import shm_root


def _shared_root(cfg: Config, run_dir: Path | None) -> Path:
    if not cfg.weights.dir and run_dir is None:
        raise ConfigError("weights.backend=dir needs a shared directory: set weights.dir=/shared/path")
    return Path(cfg.weights.dir) if cfg.weights.dir else Path(run_dir) / "weights"


class DirectoryPublisher(FilePublisher):
    transport = "dir"
    fsync = True

    @classmethod
    def from_config(cls, cfg: Config, broker: Broker, run_dir: Path | None) -> "DirectoryPublisher":
        return cls(
            broker,
            Keys.of(cfg),
            cfg.weights.keep,
            root=_shared_root(cfg, run_dir),
            cache_root=shm_root(cfg.run.name, run_dir),
        )


class DirectoryLoader(FileLoader):
    transport = "dir"

    @classmethod
    def from_config(cls, cfg: Config, broker: Broker, run_dir: Path | None) -> "DirectoryLoader":
        _shared_root(cfg, run_dir)  # the same check as the publisher's: one message for every role
        return cls(broker, Keys.of(cfg), cache_root=shm_root(cfg.run.name, run_dir))

    def _materialise(self, src: Path, dst: Path) -> None:
        shutil.copyfile(src, dst)
