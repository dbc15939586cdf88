"""`cuda_ipc` backend, generator side: check a published handle, and the vLLM worker extension that
maps the trainer's buffer and loads the tensors in place.

An adapter version (trainer.lora) is not loaded in place: vLLM's LoRA loading takes a PEFT folder,
so `fetch` maps the buffer in the generator's own process, copies the adapter's tensors (megabytes)
out and writes the folder to this host's shared memory (`shm_root`), as the `shm` backend would.

See cuda_ipc.py for the backend and its wire format; the trainer side is cuda_ipc_publish.py.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from pathlib import Path

import torch

from streamrl.config.schema import Config
from streamrl.core.broker import Broker, Keys
from streamrl.core.errors import ConfigError
from streamrl.weights.adapter import is_peft_dir, write_peft_dir
from streamrl.weights.cuda_ipc import decode_spec, open_spec
from streamrl.weights.files import version_dirs
from streamrl.weights.shm import shm_root
from streamrl.weights.store import WeightHandle, WeightLoader


class CudaIpcLoader(WeightLoader):
    transport = "cuda_ipc"
    vllm_extension = "streamrl.weights.cuda_ipc_load.VLLMIpcExtension"
    hooks_in_thread = False  # decoding a handle is a few cheap calls

    @classmethod
    def from_config(cls, cfg: Config, broker: Broker, run_dir) -> "CudaIpcLoader":
        # device_count asks NVML; is_available() calls cudaGetDeviceCount, which initialises CUDA in
        # this process, and a generator whose vLLM EngineCore is forked must not have (fork is ~25 s faster).
        if torch.cuda.device_count() == 0:
            raise ConfigError(
                "weights.backend=cuda_ipc needs a CUDA GPU shared by trainer and generators; "
                "on CPU set weights.backend=shm"
            )
        return cls(broker, Keys(cfg.run.name), shm_root(cfg.run.name, run_dir))

    def __init__(self, broker: Broker, keys: Keys, cache_root: Path | None = None):
        super().__init__(broker, keys)
        self.cache_dir = Path(cache_root or shm_root(keys.run, None)) / f"ipc-adapters-{os.getpid()}"
        """Where adapter versions are materialised as PEFT folders (vLLM's LoRA loading reads files)."""

    async def fetch(self, handle: WeightHandle) -> str:
        if handle.is_adapter and handle.transport == self.transport:  # copies bytes: off the loop
            return await asyncio.to_thread(self._fetch, handle)
        return await super().fetch(handle)

    def _fetch(self, handle: WeightHandle) -> str:
        spec = decode_spec(handle.handle)  # fail here (with the fix) rather than inside vLLM's worker
        return self._materialise_adapter(handle, spec) if handle.is_adapter else handle.handle

    def _materialise_adapter(self, handle: WeightHandle, spec: dict) -> str:
        dst = self.cache_dir / f"v{handle.version}"
        if is_peft_dir(dst):
            return str(dst)
        packed = open_spec(spec)  # initialises CUDA here: after the engine started, so its fork is done
        state = {name: t.to("cpu", copy=True) for name, t in packed.tensors()}
        del packed
        tmp = self.cache_dir / f".tmp-v{handle.version}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True)
        try:
            write_peft_dir(tmp, state, handle.adapter)
            shutil.rmtree(dst, ignore_errors=True)
            os.rename(tmp, dst)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        local = version_dirs(self.cache_dir)
        keep = set(sorted(local)[-self.local_copies :]) | {handle.version}  # vLLM may re-read these
        for v, path in local.items():
            if v not in keep:
                shutil.rmtree(path, ignore_errors=True)
        return str(dst)

    async def close(self) -> None:
        shutil.rmtree(self.cache_dir, ignore_errors=True)

    def reload_call(self, local: str) -> tuple[str, dict]:
        return "streamrl_reload_ipc", {"spec": local}


class VLLMIpcExtension:
    """Methods added to vLLM's GPU worker (worker_extension_cls); runs in vLLM's worker process."""

    def streamrl_reload_ipc(self, spec: str) -> int:
        packed = open_spec(decode_spec(spec))
        device = self.device  # vLLM's worker attribute: the GPU its model lives on
        weights = ((name, t if t.device == device else t.to(device, non_blocking=True)) for name, t in packed.tensors())
        runner = self.model_runner
        with torch.no_grad():
            self._streamrl_load(runner, weights)
        torch.cuda.current_stream().synchronize()  # done reading before the publisher may reuse the memory
        n = len(packed.entries)
        del packed, weights
        return n

    def _streamrl_load(self, runner, weights) -> None:
        if getattr(runner.model_config, "quantization", None) is None:
            # Unquantized: the model's own loaders copy straight into the live parameters (what RL
            # frameworks do). vLLM's reload_weights would first move every layer to `meta` and
            # rebuild it, which only quantized/repacked weights need.
            runner.get_model().load_weights(weights)
        else:
            self.reload_weights(weights_iterator=weights)
