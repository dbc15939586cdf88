"""`cuda_ipc` backend, generator side: check a published handle, and the vLLM worker extension that
maps the trainer's buffer and loads the tensors in place.

An adapter version (trainer.lora) goes to vLLM from GPU memory too: `fetch` writes only the
version's adapter_config.json to a folder in this host's shared memory (`shm_root`); the worker
extension's `streamrl_add_lora_ipc` maps the buffer, copies it once on the GPU and has vLLM's own
LoRA manager add it (eviction, slots) with the tensors in hand instead of a safetensors file. After
the switch `settle` writes the folder's tensor file (one device-to-host copy) off the switch's path:
vLLM re-reads the folder only if it evicts that version while a request still runs on it.

See cuda_ipc.py for the backend and its wire format; the trainer side is cuda_ipc_publish.py.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import torch

from streamrl.config.schema import Config
from streamrl.core.broker import Broker, Keys
from streamrl.core.errors import ConfigError
from streamrl.weights.cuda_ipc import decode_spec, open_spec
from streamrl.weights.files import version_dirs
from streamrl.weights.lora import ADAPTER_CONFIG, ADAPTER_FILE, is_peft_dir, write_peft_dir_tensors
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
        return cls(broker, Keys.of(cfg), shm_root(cfg.run.name, run_dir))

    def __init__(self, broker: Broker, keys: Keys, cache_root: Path | None = None):
        super().__init__(broker, keys)
        self.cache_dir = Path(cache_root or shm_root(keys.run, None)) / f"ipc-adapters-{os.getpid()}"
        """Where adapter versions are materialised as PEFT folders (vLLM's LoRA loading reads files)."""

    def _fetch(self, handle: WeightHandle) -> str:
        decode_spec(handle.handle)  # fail here (with the fix) rather than inside vLLM's worker
        return self._adapter_folder(handle) if handle.is_adapter else handle.handle

    def _adapter_folder(self, handle: WeightHandle) -> str:
        """The version's folder, holding its adapter_config.json (what names it; the tensors come later)."""
        dst = self.cache_dir / f"v{handle.version}"
        if (dst / ADAPTER_CONFIG).is_file():
            return str(dst)
        tmp = self.cache_dir / f".tmp-v{handle.version}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True)
        try:
            (tmp / ADAPTER_CONFIG).write_text(handle.adapter)
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

    def adapter_call(self, handle: WeightHandle, request) -> tuple[str, dict] | None:
        kwargs = {"spec": handle.handle, "name": request.lora_name, "lora_id": request.lora_int_id}
        return "streamrl_add_lora_ipc", {**kwargs, "path": request.lora_path}

    def settle(self, handle: WeightHandle, local: str) -> None:
        """The folder's adapter_model.safetensors from the published buffer: one device-to-host copy."""
        folder = Path(local)
        if not handle.is_adapter or is_peft_dir(folder) or not folder.is_dir():
            return
        packed = open_spec(decode_spec(handle.handle))  # initialises CUDA here: after the engine's fork
        state = dict(packed.tensors(packed.buffer.to("cpu")))
        del packed
        tmp = folder / f".{ADAPTER_FILE}.{uuid.uuid4().hex[:8]}"
        write_peft_dir_tensors(tmp, state)
        os.rename(tmp, folder / ADAPTER_FILE)

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

    def streamrl_add_lora_ipc(self, spec: str, name: str, lora_id: int, path: str) -> bool:
        """Add adapter version `spec` (an adapter's packed buffer) as LoRARequest(name, lora_id, path)
        straight from GPU memory; `path` holds its adapter_config.json."""
        from vllm.lora.request import LoRARequest

        packed = open_spec(decode_spec(spec))
        # Our own copy: vLLM scales lora_B in place, and the publisher frees its buffer at its gc.
        own = packed.buffer.to(self.device, copy=True)
        torch.cuda.current_stream().synchronize()
        tensors = dict(packed.tensors(own))
        del packed
        request = LoRARequest(lora_name=name, lora_int_id=lora_id, lora_path=path)
        return add_lora_from_memory(self.model_runner.lora_manager, request, tensors)

    def _streamrl_load(self, runner, weights) -> None:
        if getattr(runner.model_config, "quantization", None) is None:
            # Unquantized: the model's own loaders copy straight into the live parameters (what RL
            # frameworks do). vLLM's reload_weights would first move every layer to `meta` and
            # rebuild it, which only quantized/repacked weights need.
            runner.get_model().load_weights(weights)
        else:
            self.reload_weights(weights_iterator=weights)


def add_lora_from_memory(manager, request, tensors: dict[str, torch.Tensor]) -> bool:
    """vLLM's own `add_adapter` on its worker LoRA manager (validation against the LoRA config, CPU
    cache eviction, slot activation), with the adapter's tensors given rather than read from
    `request.lora_path` (which must hold adapter_config.json): its LoRAModel is built with
    `from_lora_tensors` where vLLM would call `from_local_checkpoint`. The LoRA model stays on the
    tensors' device, so activating it is a device-to-device copy (no pinned host staging)."""
    base = manager._lora_model_cls
    device = next(iter(tensors.values())).device

    class FromMemory:
        @staticmethod
        def from_local_checkpoint(lora_dir, expected_lora_modules, *, peft_helper, lora_model_id=None, **kw):
            keep = ("dtype", "model_vocab_size", "weights_mapper", "skip_prefixes")
            args = {k: v for k, v in kw.items() if k in keep}
            return base.from_lora_tensors(
                lora_model_id=lora_model_id, tensors=tensors, peft_helper=peft_helper, device=device, **args
            )

    manager._lora_model_cls = FromMemory
    try:
        return manager.add_adapter(request)
    finally:
        manager._lora_model_cls = base
