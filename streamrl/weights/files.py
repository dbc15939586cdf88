"""What the file-based backends share: one directory per version, atomic writes (publisher), local
copies (loader), gc.

Layout under a backend's root: `v<version>/model.safetensors` (Hugging Face names, so vLLM's
`reload_weights(weights_path=...)` loads it directly), or for an adapter version (trainer.lora)
`v<version>/adapter_model.safetensors` + `adapter_config.json` (PEFT's layout, what vLLM's
LoRARequest loads), and `.tmp-*` directories while writing.
A reader's local copies live in `fetched-<pid>` under its cache root, so the publisher's gc can
never delete a directory a generator is about to reload from.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path

import torch
from safetensors.torch import save_file

from streamrl.core.broker import Broker, Keys
from streamrl.weights.lora import ADAPTER_CONFIG, ADAPTER_FILE, is_peft_dir, write_peft_dir
from streamrl.weights.store import WeightHandle, WeightLoader, WeightPublisher, WeightStoreError

WEIGHTS_FILE = "model.safetensors"
_VERSION_DIR = re.compile(r"^v(\d+)$")
_FETCHED_DIR = re.compile(r"^fetched-(\d+)$")


def version_dirs(root: Path) -> dict[int, Path]:
    """version -> directory for every complete version under `root`."""
    out: dict[int, Path] = {}
    if root.is_dir():
        for child in root.iterdir():
            m = _VERSION_DIR.match(child.name)
            if m and ((child / WEIGHTS_FILE).is_file() or is_peft_dir(child)):
                out[int(m.group(1))] = child
    return out


def version_files(adapter: bool) -> tuple[str, ...]:
    """The files of one version's folder: full weights, or an adapter's PEFT pair."""
    return (ADAPTER_FILE, ADAPTER_CONFIG) if adapter else (WEIGHTS_FILE,)


def write_version(
    root: Path, version: int, state_dict: dict[str, torch.Tensor], fsync: bool = False, adapter: str = ""
) -> tuple[Path, int]:
    """Write `v<version>/model.safetensors` (or, given an adapter config JSON, the PEFT pair) via a
    temp directory + rename; return (dir, bytes of the tensor file)."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-v{version}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        if adapter:
            size = write_peft_dir(tmp, state_dict, adapter, fsync=fsync)
        else:
            path = tmp / WEIGHTS_FILE
            save_file(state_dict, str(path), metadata={"format": "pt"})
            if fsync:  # a shared filesystem: make the bytes durable before the name appears
                with open(path, "rb") as fh:
                    os.fsync(fh.fileno())
            size = path.stat().st_size
        final = root / f"v{version}"
        if final.exists():  # the same version republished (trainer restarted from a checkpoint)
            shutil.rmtree(final)
        os.rename(tmp, final)
        return final, size
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class FilePublisher(WeightPublisher):
    """Base of the `shm` and `dir` publishers: `root` holds the published versions; `cache_root` is
    where this host's readers keep their copies (collected here once their process is gone)."""

    fsync = False

    def __init__(self, broker: Broker, keys: Keys, keep: int, root: Path, cache_root: Path):
        super().__init__(broker, keys, keep)
        self.root = Path(root)
        self.cache_root = Path(cache_root)

    def _write(self, version: int, state_dict: dict[str, torch.Tensor], adapter: str = "") -> tuple[str, int]:
        final, size = write_version(self.root, version, state_dict, fsync=self.fsync, adapter=adapter)
        return str(final), size

    def _versions(self) -> list[int]:
        return list(version_dirs(self.root))

    def _collect(self, keep_versions: set[int]) -> list[int]:
        deleted = []
        for v, path in version_dirs(self.root).items():
            if v not in keep_versions:
                shutil.rmtree(path, ignore_errors=True)
                deleted.append(v)
        self._collect_dead_readers()
        return sorted(deleted)

    def _collect_dead_readers(self) -> None:
        """Local copies of readers on this host whose process is gone (crashed generators)."""
        if not self.cache_root.is_dir():
            return
        for child in self.cache_root.iterdir():
            m = _FETCHED_DIR.match(child.name)
            if m and not _pid_alive(int(m.group(1))):
                shutil.rmtree(child, ignore_errors=True)


class FileLoader(WeightLoader):
    """Base of the `shm` and `dir` loaders: this process's copies live in `cache_root/fetched-<pid>`,
    so the publisher's gc never deletes a directory a generator is about to reload from."""

    def __init__(self, broker: Broker, keys: Keys, cache_root: Path):
        super().__init__(broker, keys)
        self.cache_root = Path(cache_root)
        self.cache_dir = self.cache_root / f"fetched-{os.getpid()}"

    def _materialise(self, src: Path, dst: Path) -> None:
        """Make `dst` a readable copy of `src` (a hard link or a byte copy)."""
        raise NotImplementedError

    def _fetch(self, handle: WeightHandle) -> str:
        dst = self.cache_dir / f"v{handle.version}"
        files = version_files(handle.is_adapter)
        if all((dst / f).is_file() for f in files):
            return str(dst)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.cache_dir / f".tmp-v{handle.version}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            for name in files:
                self._materialise(Path(handle.handle) / name, tmp / name)
            shutil.rmtree(dst, ignore_errors=True)  # a partial copy of an earlier, interrupted fetch
            os.rename(tmp, dst)
        except FileNotFoundError:
            shutil.rmtree(tmp, ignore_errors=True)
            raise WeightStoreError(
                f"weights version {handle.version} is gone from {handle.handle} (collected before it was "
                "fetched); fetch the newest one instead, or raise weights.keep"
            ) from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._trim_cache(keep_version=handle.version)
        return str(dst)

    def _trim_cache(self, keep_version: int) -> None:
        local = version_dirs(self.cache_dir)
        newest = sorted(v for v in local if v <= keep_version)[-self.local_copies :]
        for v, path in local.items():
            if v not in newest and v != keep_version:
                shutil.rmtree(path, ignore_errors=True)

    async def close(self) -> None:
        shutil.rmtree(self.cache_dir, ignore_errors=True)
