"""A vLLM worker extension for tests of tensor-parallel engines: what one TP worker holds.

Installed as the engine's worker_extension_cls by tests/programs/tp_script.py; every method runs in
each TP worker (vLLM's collective_rpc) and returns one result per worker, in rank order.
"""

from __future__ import annotations

import torch

import streamrl.generate.cpu_tp  # noqa: F401 (the CPU TP workers' all-reduce, as streamrl's own extension sets it)


class TPCheck:
    def tp_rank_and_pid(self) -> tuple[int, int]:
        import os

        from vllm.distributed import get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank(), os.getpid()

    def tp_weights_diff(self, path: str) -> dict[str, float]:
        """Per parameter the model's HF names hold whole (embeddings, lm_head, norms): the largest change
        loading `path` (a model.safetensors) would make to this worker's shard of it, with nothing changed;
        0.0 where this worker already holds exactly that version. Each parameter's own weight_loader picks
        this rank's slice (a vocab-parallel embedding's rows), as a reload does. Fused and repacked
        linear layers (the CPU build repacks them after loading) are not compared here."""
        from safetensors.torch import load_file
        from vllm.model_executor.model_loader.weight_utils import default_weight_loader

        params = dict(self.model_runner.get_model().named_parameters())
        out = {}
        with torch.no_grad():
            for name, tensor in load_file(path).items():
                param = params.get(name)
                if param is None or param.numel() == 0:
                    continue
                before = param.detach().clone()
                getattr(param, "weight_loader", default_weight_loader)(param, tensor)
                out[name] = float((param.detach() - before).abs().max())
                param.copy_(before)
        return out
