"""The CPU build's tensor-parallel workers all-reduce through torch.distributed (gloo), not vLLM's
shared-memory communicator: on the 2-core VM two TP=2 workers of the tiny model deadlocked in their
first decode steps with it, each waiting in a different all-reduce (one after a layer's attention, the
other after its MLP; py-spy), both idle, in 2 of 2 runs under load. Gloo's all-reduce is a plain
collective: every rank blocks in the same call.

Imported in each vLLM worker process as the engine's worker extension (vLLM's worker_extension_cls,
resolved before the worker's distributed groups exist): the import is the patch. streamrl's engine
names it for a CPU engine with tensor_parallel_size > 1 (streamrl/generate/vllm_engine.py); a worker
extension of a weight backend (cuda_ipc) is GPU-only, so the two never meet.
"""

from __future__ import annotations


def use_torch_distributed_all_reduce() -> None:
    """Make vLLM's CpuCommunicator pick torch.distributed for its TP groups (its own fallback path
    where the ranks disagree on the shared-memory group's name)."""
    from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator

    CpuCommunicator._all_group_ranks_share_shm_group_name = lambda self: False


use_torch_distributed_all_reduce()


class CpuTPExtension:
    """Adds nothing to the worker: importing this module is what changes it."""
