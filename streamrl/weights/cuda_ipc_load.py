"""`cuda_ipc` backend, generator side: check a published handle, and the vLLM worker extension that
maps the trainer's buffer and loads the tensors in place.

See cuda_ipc.py for the backend and its wire format; the trainer side is cuda_ipc_publish.py.
"""

from __future__ import annotations

import torch

from streamrl.config.schema import Config
from streamrl.core.broker import Broker, Keys
from streamrl.core.errors import ConfigError
from streamrl.weights.cuda_ipc import decode_spec, open_spec
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
        return cls(broker, Keys.of(cfg))

    def _fetch(self, handle: WeightHandle) -> str:
        decode_spec(handle.handle)  # fail here (with the fix) rather than inside vLLM's worker
        return handle.handle

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
