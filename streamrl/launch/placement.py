"""Which GPUs each process of a job gets (supervisor.devices, generator.tensor_parallel_size), and the
layouts that cannot work, found before anything starts: by `streamrl config` and `streamrl up`'s
pre-flight (streamrl/launch/preflight.py), and shown per process by `streamrl config --explain`.

    for p in layout(cfg): print(p.worker_id, p.devices, p.note)
    errors = placement_errors(cfg, host_gpus=8, heads=(32, 8))   # [] when the layout adds up

The rules that need only the config (a GPU listed twice in one entry, a generator entry of other than
tensor_parallel_size GPUs) are Config's own validators (streamrl/config/schema.py); the rules here need
the host (its GPU count) or the model (its heads).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from streamrl.config.schema import Config
from streamrl.launch.supervisor import role_counts

COMPUTE_ROLES = ("trainer", "generator", "reference", "judge")
"""Roles whose processes hold a model on their GPUs; the others need none."""


@dataclass(frozen=True)
class Placed:
    """One process of the job and the GPUs it sees."""

    worker_id: str
    role: str
    devices: tuple[int, ...] | None
    """Host GPU indices (its CUDA_VISIBLE_DEVICES), None: not listed (every GPU of the host)."""
    note: str
    """What runs on them: `FSDP2 ranks 0-3`, `vLLM TP=2 (worker r on the r-th GPU)`, ..."""


def _devices(cfg: Config, role: str, index: int) -> tuple[int, ...] | None:
    listed = cfg.supervisor.devices_of(role, index)
    return None if listed is None else tuple(int(d) for d in listed.split(","))


def layout(cfg: Config) -> list[Placed]:
    """Every process `streamrl up` starts, in start order, with its GPUs (the supervisor's child_env)."""
    out = []
    tp = cfg.generator.tensor_parallel_size
    for role, count in role_counts(cfg).items():
        for i in range(count):
            if role == "trainer":
                n = cfg.trainer.world_size
                note = f"{'FSDP2 ' if n > 1 else ''}rank{'s 0-' + str(n - 1) if n > 1 else ' 0'} ({cfg.trainer.device})"
            elif role == "generator":
                note = f"vLLM engine, tensor_parallel_size={tp}" + (
                    " (TP worker r on the r-th GPU listed)" if tp > 1 else ""
                )
            elif role in COMPUTE_ROLES:
                note = "model copy"
            else:
                note = "no model"
            out.append(Placed(f"{role}-{i}", role, _devices(cfg, role, i), note))
    return out


def describe(cfg: Config, host_gpus: int | None = None) -> str:
    """The layout as comment lines for `streamrl config --explain`."""
    lines = ["# placement (streamrl/launch/placement.py): process -> GPUs (CUDA_VISIBLE_DEVICES)"]
    if host_gpus is not None:
        lines[0] += f"; this host has {host_gpus} GPU(s)"
    for p in layout(cfg):
        where = ",".join(map(str, p.devices)) if p.devices is not None else "(not listed: every GPU)"
        lines.append(f"#   {p.worker_id:<12} {where:<24} {p.note}")
    return "\n".join(lines) + "\n"


def needed_gpus(cfg: Config) -> tuple[int, str]:
    """GPUs a job without supervisor.devices needs at least, and the sum that gives it: a TP generator
    may not share its GPUs with another generator (each engine owns its NCCL group)."""
    tp, count = cfg.generator.tensor_parallel_size, cfg.generator.count
    parts = [(count * tp, f"generator.count={count} x tensor_parallel_size={tp}")]
    if cfg.trainer.device == "cuda":
        parts.append((cfg.trainer.world_size, f"trainer.world_size={cfg.trainer.world_size}"))
    return max(n for n, _ in parts), " and ".join(why for _, why in parts)


def placement_errors(cfg: Config, host_gpus: int, heads: tuple[int, int] | None) -> list[str]:
    """Every layout problem of `cfg` on a host with `host_gpus` GPUs (0: no GPU, host checks skipped)
    for a model of `heads` = (attention heads, KV heads) (None: unknown, not checked)."""
    errors = []
    tp = cfg.generator.tensor_parallel_size
    if heads is not None and (msg := head_error(tp, *heads)):
        errors.append(msg)
    if host_gpus <= 0:
        return errors
    placed = layout(cfg)
    for p in placed:
        beyond = [d for d in p.devices or () if d >= host_gpus]
        if beyond:
            errors.append(
                f"supervisor.devices.{p.role} gives {p.worker_id} GPU(s) {beyond}, but this host has {host_gpus} "
                f"(0-{host_gpus - 1}); list GPUs that exist, or run on a host with more"
            )
    if not cfg.supervisor.devices.get("generator") and tp > 1:
        need, why = needed_gpus(cfg)
        if cfg.generator.count * tp > host_gpus:
            errors.append(
                f"{why} needs {need} GPUs, but this host has {host_gpus}; lower generator.count or "
                "generator.tensor_parallel_size, or spread the generators over hosts (`streamrl worker generator`, "
                "docs/multihost.md)"
            )
        elif cfg.generator.count > 1:
            errors.append(
                f"generator.count={cfg.generator.count} generators of tensor_parallel_size={tp} would all see every "
                'GPU and start on the same ones; give each its own in supervisor.devices.generator (e.g. ["0,1", '
                '"2,3"])'
            )
    gens = [p for p in placed if p.role == "generator" and p.devices is not None]
    if tp > 1:
        for i, a in enumerate(gens):
            for b in gens[i + 1 :]:
                if shared := sorted(set(a.devices) & set(b.devices)):
                    errors.append(
                        f"{a.worker_id} and {b.worker_id} both get GPU(s) {shared}: two tensor-parallel engines "
                        f"cannot share devices; give supervisor.devices.generator one entry of {tp} GPUs per "
                        f"generator (generator.count={cfg.generator.count}), or lower generator.count"
                    )
    return errors


def head_error(tp: int, heads: int, kv_heads: int) -> str | None:
    """vLLM's rule: tensor_parallel_size divides the attention heads, and the KV heads are split
    (divisible by it) or replicated (it divisible by them)."""
    if tp == 1:
        return None
    fits = [n for n in range(1, heads + 1) if heads % n == 0 and (kv_heads % n == 0 or n % kv_heads == 0)]
    if heads % tp == 0 and (kv_heads % tp == 0 or tp % kv_heads == 0):
        return None
    return (
        f"generator.tensor_parallel_size={tp} does not split the model's {heads} attention heads / {kv_heads} KV "
        f"heads (it must divide the heads, and divide or be a multiple of the KV heads); choose one of {fits}"
    )


def model_heads(cfg: Config) -> tuple[int, int] | None:
    """(attention heads, KV heads) of the policy model: model.tiny's, or model.path's config.json
    (None where it cannot be read: check_model_path reports that)."""
    import json

    if not cfg.model.path:
        return cfg.model.tiny.num_heads, cfg.model.tiny.num_kv_heads
    try:
        raw = json.loads((Path(cfg.model.path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    raw = raw.get("text_config", raw)
    heads = raw.get("num_attention_heads")
    return (heads, raw.get("num_key_value_heads", heads)) if heads else None


def host_gpu_count() -> int:
    """GPUs on this host as `nvidia-smi -L` lists them (the indices CUDA_VISIBLE_DEVICES takes, whatever
    this process's own CUDA_VISIBLE_DEVICES); 0 without an NVIDIA driver. No CUDA is initialised here."""
    if not Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return len(re.findall(r"^GPU \d+:", out, flags=re.M))
