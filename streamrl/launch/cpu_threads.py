"""How many CPU threads the torch of each role process gets on a host without a GPU (OMP_NUM_THREADS).

A process that imports torch starts one OpenMP thread per core. On a CPU host every computing role
(the generator's vLLM engine, each trainer rank, the reference, a judge) does that, so a 2-core machine
runs 8+ such threads; their spin-waits then burn the cores the others need. Measured on the 2-core VM,
a 30-step `streamrl up` (configs/tiny-cpu.yaml) beside another job: 93-107 s and 118-134 CPU-seconds
with every role at 2 threads, 49 s and 46-57 CPU-seconds at 1 (the trainer alone: 22-26 -> 6 CPU-s).
So `up` shares the cores out among the computing processes, at least one thread each. A GPU host is
left alone: its roles compute on the GPU, and vLLM's GPU worker sets its own threads.
"""

from __future__ import annotations

import os
from pathlib import Path

from streamrl.config.schema import Config

NVIDIA_CONTROL = Path("/dev/nvidiactl")
"""Present where an NVIDIA driver is loaded (also inside GPU containers); checked instead of importing torch."""


def computing_processes(cfg: Config, counts: dict[str, int]) -> int:
    """Processes of the job that run torch compute: each trainer rank, generator engine, reference, judge."""
    return cfg.trainer.world_size + counts["generator"] + counts["reference"] + counts["judge"]


def threads_per_role(cfg: Config, counts: dict[str, int], cores: int, gpu_host: bool) -> int | None:
    """supervisor.cpu_threads, else (CPU host) the cores shared among the computing processes; None:
    leave torch's own default (a GPU host)."""
    if cfg.supervisor.cpu_threads is not None:
        return cfg.supervisor.cpu_threads
    if gpu_host:
        return None
    return max(1, cores // max(1, computing_processes(cfg, counts)))


def host_cores() -> int:
    """The cores this process may run on (its affinity: a container's or taskset's limit, not the host's)."""
    affinity = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere every core counts
    return len(affinity(0)) if affinity else os.cpu_count() or 1


def is_gpu_host() -> bool:
    return NVIDIA_CONTROL.exists()
