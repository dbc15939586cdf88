"""Sizing a broker cluster for a large job from what `streamrl bench broker --cluster` measured.

Pure arithmetic (tests/unit/test_broker_sizing.py); the assumptions are arguments with documented
defaults, printed beside the answer (docs/scaling-brokers.md, "Sizing a 1,000-GPU job").

    need = rollouts_needed(gpus=1000, tokens_per_gpu_s=4000, completion_tokens=1024)   # ~2,930/s
    plan = size_cluster(need, master_cpu_s=40e-6, replica_cpu_s=10e-6, rollout_bytes=9000, annotation_bytes=4200)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

GEN_FRACTION = 0.75
"""Share of a job's GPUs that generate (the rest train): asynchronous RL jobs run 2-4 generation GPUs
per training GPU."""
CORE_BUDGET = 0.5
"""A node's command thread kept at or below half a core: headroom for bursts, a replica's full resync
after a failover (the master forks and streams a snapshot) and AOF rewrites."""
NIC_GBIT = 25.0
"""A broker host's network: 25 Gbit/s, common for CPU hosts beside a GPU cluster."""
NIC_BUDGET = 0.5
"""Share of the NIC the broker may use (the same headroom as CORE_BUDGET)."""
ROLLOUT_READERS = 3
"""Consumer groups that read every rollout: reward, reference, the trainer's assembler."""


def rollouts_needed(
    gpus: int, tokens_per_gpu_s: float, completion_tokens: int, gen_fraction: float = GEN_FRACTION
) -> float:
    """Rollouts/s a job's generators produce: generation GPUs x their decode tokens/s / tokens per rollout."""
    return gpus * gen_fraction * tokens_per_gpu_s / completion_tokens


@dataclass
class Plan:
    rollouts_per_s: float
    masters_for_cpu: int
    masters_for_network: int
    masters: int
    nodes: int
    partitions: int
    master_core_frac: float
    """Command-thread share of one core on each master at that size."""
    gbit_per_master: float
    gbit_total: float


def size_cluster(
    rollouts_per_s: float,
    master_cpu_s: float,
    replica_cpu_s: float,
    rollout_bytes: float,
    annotation_bytes: float,
    replicas: int = 1,
    readers: int = ROLLOUT_READERS,
    core_budget: float = CORE_BUDGET,
    nic_gbit: float = NIC_GBIT,
    nic_budget: float = NIC_BUDGET,
) -> Plan:
    """Masters, nodes and partitions for `rollouts_per_s`, given measured per-rollout costs summed over
    the masters (`master_cpu_s`) and over the replicas (`replica_cpu_s`) of a partitioned run.

    Bytes through the masters per rollout: the rollout in and out once per reader, its annotations
    in and out once (the trainer reads them), and both once more per replica (the replication
    stream). A replica's CPU runs on its own host, so it sizes the replica hosts, not the masters.
    """
    cpu_masters = math.ceil(rollouts_per_s * master_cpu_s / core_budget)
    per_rollout = rollout_bytes * (1 + readers + replicas) + annotation_bytes * (2 + replicas)
    bits_s = rollouts_per_s * per_rollout * 8
    net_masters = math.ceil(bits_s / (nic_gbit * 1e9 * nic_budget))
    masters = max(3, cpu_masters, net_masters)  # a Redis Cluster has 3 masters at least
    replica_frac = rollouts_per_s * replica_cpu_s / max(1, masters * replicas)
    if replica_frac > core_budget:  # replicas apply the same stream: rarely the bound, checked anyway
        masters = math.ceil(rollouts_per_s * replica_cpu_s / (core_budget * replicas))
    return Plan(
        rollouts_per_s=round(rollouts_per_s, 1),
        masters_for_cpu=cpu_masters,
        masters_for_network=net_masters,
        masters=masters,
        nodes=masters * (1 + replicas),
        partitions=masters,
        master_core_frac=round(rollouts_per_s * master_cpu_s / masters, 3),
        gbit_per_master=round(bits_s / masters / 1e9, 2),
        gbit_total=round(bits_s / 1e9, 2),
    )


def projection_lines(plans: dict[str, Plan]) -> list[str]:
    """The sizing table as printed by the bench: one line per assumed generation speed."""
    out = [
        f"sizing (assumptions: {GEN_FRACTION:.0%} of GPUs generate; a master's command thread <= "
        f"{CORE_BUDGET:.0%} of a core; {NIC_GBIT:.0f} Gbit/s NICs used <= {NIC_BUDGET:.0%}; one replica per "
        f"master; {ROLLOUT_READERS} consumer groups read every rollout):"
    ]
    for label, p in plans.items():
        d = asdict(p)
        out.append(
            f"  {label}: {d['rollouts_per_s']:,.0f} rollouts/s -> {d['masters']} masters ({d['nodes']} nodes with "
            f"replicas; cpu needs {d['masters_for_cpu']}, network {d['masters_for_network']}), "
            f"rollout.partitions={d['partitions']}, {d['master_core_frac']:.0%} of a core and "
            f"{d['gbit_per_master']} Gbit/s per master, {d['gbit_total']} Gbit/s in all"
        )
    return out
