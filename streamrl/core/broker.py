"""The broker protocol every role talks through, and the run's key names.

Implementations live in `brokers/` (Redis Streams; the embedded launcher). Roles receive a
broker instance in their constructor; nothing here is global.

    broker = await connect(url)              # brokers.redis_streams.RedisBroker
    keys = Keys("tiny")                      # keys.rollouts == "streamrl:tiny:rollouts"
    keys = Keys.of(cfg)                      # the job's layout: partitions, cluster hash tags
    await broker.ensure_group(keys.rollouts, "reward")
    for entry in await broker.read_group(keys.rollouts, "reward", "reward-0", count=64):
        ...; await broker.ack(keys.rollouts, "reward", [entry.id])
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from typing import Protocol

from streamrl.core.broker_url import is_cluster_url
from streamrl.core.errors import ConfigError, StreamRLError


@dataclass(frozen=True)
class Entry:
    """One stream entry: its id and its payload (the bytes of field `d`; None if the field is missing)."""

    id: str
    data: bytes | None
    fields: dict[str, bytes]


class Broker(Protocol):
    """What streamrl needs from a message broker (Redis Streams semantics)."""

    async def add(self, stream: str, data: bytes, maxlen: int | None = None) -> str:
        """Append one entry with field `d`; return its id. `maxlen` trims approximately."""

    async def add_many(self, stream: str, items: list[bytes], maxlen: int | None = None) -> list[str]:
        """Append several entries in one round trip (pipelined)."""

    async def ensure_group(self, stream: str, group: str, start: str = "0") -> None:
        """Create the consumer group (and the stream) if missing; idempotent."""

    async def read_group(
        self, stream: str, group: str, consumer: str, count: int = 64, block_ms: int | None = 200, start: str = ">"
    ) -> list[Entry]:
        """Read new entries for `consumer` (start=">"), or its own un-acked ones after id `start` ("0": all)."""

    async def read_groups(
        self, streams: list[str], group: str, consumer: str, count: int = 64, block_ms: int | None = 200
    ) -> dict[str, list[Entry]]:
        """Read new entries from several streams with one XREADGROUP."""

    async def ack(self, stream: str, group: str, ids: list[str]) -> int:
        """Acknowledge entries (only after their effect is durable)."""

    async def ack_many(self, group: str, ids: dict[str, list[str]]) -> int:
        """Acknowledge entries of several streams ({stream: ids}) in one round trip where they share a server."""

    async def add_and_ack(
        self, stream: str, items: list[bytes], ack_stream: str, group: str, ids: list[str], maxlen: int | None = None
    ) -> list[str]:
        """Append `items` to `stream` and then ack `ids` of `ack_stream` (the entries they were made
        from): atomically in one round trip where both streams share a server; the ack never comes first."""

    async def claim_idle(
        self, stream: str, group: str, consumer: str, min_idle_ms: int, count: int = 64
    ) -> list[Entry]:
        """Take over entries pending longer than `min_idle_ms` on any consumer (XAUTOCLAIM)."""

    async def touch(self, stream: str, group: str, consumer: str, ids: list[str]) -> None:
        """Reset the idle time of `consumer`'s own pending entries (XCLAIM JUSTID), so work that
        is still in progress is not taken over by XAUTOCLAIM."""

    async def offer(self, stream: str, group: str, consumer: str, idle_ms: int) -> int:
        """Make `consumer`'s pending entries look idle for `idle_ms` (XCLAIM ... IDLE), so any consumer's
        `claim_idle(min_idle_ms <= idle_ms)` takes them over now; return how many. A restarted worker
        hands back what its previous life held instead of sitting on it through a slow start."""

    async def read(self, stream: str, last_id: str = "0", count: int = 100, block_ms: int | None = None) -> list[Entry]:
        """Plain read after `last_id` (no group): control and metrics streams."""

    async def stream_len(self, stream: str) -> int: ...

    async def group_info(self, stream: str) -> list[dict]:
        """XINFO GROUPS: name, consumers, pending, lag per group."""

    async def get(self, key: str) -> bytes | None: ...

    async def set(self, key: str, value: bytes | str | int, ttl_s: float | None = None) -> None: ...

    async def incr(self, key: str, by: int = 1) -> int: ...

    async def hset(self, key: str, mapping: dict[str, bytes | str | int | float]) -> None: ...

    async def hgetall(self, key: str) -> dict[str, bytes]: ...

    async def delete(self, *keys: str) -> None: ...

    async def scan(self, pattern: str) -> list[str]: ...

    async def script(self, source: str, keys: list[str], args: list) -> object:
        """Run a server-side (Lua) script atomically: multi-key updates that must not be torn by a
        crash (streamrl.core.accounting's ledger, streamrl.core.trimming)."""

    async def close(self) -> None: ...


SLOTS = 16384


def key_slot(tag: str) -> int:
    """Redis Cluster's slot of a key whose hash tag is `tag`: CRC16-XMODEM of the tag's bytes mod 16384."""
    crc = 0
    for byte in tag.encode():
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc % SLOTS


def partition_tag(run: str, i: int, partitions: int) -> str:
    """The hash tag of partition i of P: `RUN:p<i>.<n>` with n the smallest integer >= 0 whose slot is in
    [lo + 1, hi - 1), lo = i*16384//P, hi = (i+1)*16384//P (docs/protocol.md, "Partitions"; about P tries).
    One slot off each end: `redis-cli --cluster create` rounds its P masters' boundaries where this floors,
    so a slot at either end of the plain range may be the neighbouring master's (two partitions on one)."""
    lo, hi = i * SLOTS // partitions + 1, (i + 1) * SLOTS // partitions - 1
    n = 0
    while not lo <= key_slot(f"{run}:p{i}.{n}") < hi:
        n += 1
    return f"{run}:p{i}.{n}"


async def found_partitions(broker: "Broker", run: str) -> list[str]:
    """The `rollouts` streams of `run` that exist on `broker`, in any layout (one server or cluster, any
    rollout.partitions): what a process outside the job (`streamrl status`, `streamrl producer add`) can
    tell the job's partitions from. Needs SCAN (an admin's user)."""
    name = re.escape(run)
    mine = re.compile(rf"streamrl:{name}:(\{{{name}(:p\d+\.\d+)?\}}:)?rollouts")
    return sorted(k for k in await broker.scan(f"streamrl:{run}:*rollouts") if mine.fullmatch(k))


class Keys:
    """Every key name of one run (docs/protocol.md, "Keys"): code builds no key string of its own
    (tests/unit/test_keys.py), so a rename here is a rename everywhere.

    Layout. On one server: `streamrl:RUN:NAME`. On Redis Cluster (`cluster=True`) every key of the run
    carries the hash tag `{RUN}`, `streamrl:RUN:{RUN}:NAME`, so the keys one command or script updates
    together (the ledger, the admission counter and `prompts`, ...) share a slot. With
    `rollout.partitions` P > 1, `rollouts` and `annotations` split into P partitions with a tag each,
    `streamrl:RUN:{TAG}:rollouts` and `streamrl:RUN:{TAG}:annotations`, TAG = partition_tag(RUN, i, P)
    (on a single server too): a partition's two streams share a slot (the trainer's one XREADGROUP over
    both, an annotator's add-and-ack) and partition i's slot lies in the i-th of P equal slot ranges, so
    on a cluster whose masters split the slots evenly the partitions land on different masters. A
    group's rollouts and annotations all go to partition `partition_of(group_id)`: crc32(group id as
    UTF-8) mod P.
    """

    def __init__(self, run: str, partitions: int = 1, cluster: bool = False):
        if partitions < 1:
            raise ConfigError(f"rollout.partitions={partitions}; set it to 1 or more")
        if "{" in run or "}" in run:
            raise ConfigError(f"run name {run!r} has a brace, which would break the keys' hash tags; rename the run")
        self.run = run
        self.partitions = partitions
        self.cluster = cluster
        p = f"streamrl:{run}:{{{run}}}:" if cluster else f"streamrl:{run}:"
        self.prefix = p
        self.prompts = p + "prompts"
        self.rollout_streams = [self._partition(i, "rollouts") for i in range(partitions)]
        """Every partition of `rollouts`, partition i at index i."""
        self.annotation_streams = [self._partition(i, "annotations") for i in range(partitions)]
        self.control = p + "control"
        self.metrics = p + "metrics"
        self.deadletter = p + "deadletter"
        self.weights_latest = p + "weights:latest"
        self.weights_published = p + "weights:published"
        """Stream: one short entry per publish (after weights:latest moved); generators block on it
        between their polls of weights:latest, so a new version is noticed at once."""
        self.weights_torchstore = p + "weights:torchstore"
        """Hash (`weights.backend: torchstore`): `ref`, the pickled reference of the trainer's torchstore
        controller, and `addr`, where it listens; readers in other processes join the store through it."""
        self.trainer_version = p + "trainer:version"
        self.feeder_admitted = p + "feeder:admitted"
        self.env_steps = p + "env_steps"
        """Step requests of multi-turn episodes (read by env workers, group `env`)."""
        self.run_end = p + "run:end"
        """Set when the run is over (streamrl.core.run_end); every producer may GET it."""
        self.trainer_released = p + "trainer:released"
        """Groups the trainer will never train (dropped stale / filtered): the feeder admits that many more."""
        self.trainer_checkpointed = p + "trainer:checkpointed"
        """Newest trainer version a checkpoint covers (steps above it will be replayed on resume)."""
        self.ledger_groups = p + "ledger:groups"
        """Hash: group id -> its final outcome (streamrl/core/accounting.py)."""
        self.ledger_steps = p + "ledger:steps"
        """Hash: trainer step -> the groups it trained."""
        self.ledger_group_starts = p + "ledger:group_starts"
        """Hash: group id -> attempts started (multi-turn episodes, streamrl/generate/episode_runner.py)."""
        self.eval_issued = p + "eval:issued"
        """Trainer version of the newest eval round the feeder issued (streamrl/eval/rounds.py)."""
        self.workers_prefix = p + "workers:"
        """Heartbeat keys start so: `workers:{role}:{worker_id}` (SCAN `workers_prefix + "*"`)."""

    @classmethod
    def of(cls, cfg, broker=None) -> "Keys":
        """The keys of the job `cfg` describes: its run, its rollout.partitions, and whether broker.url (or
        the connected `broker`) is a cluster."""
        rollout = getattr(cfg, "rollout", None)  # absent for a worker outside a job (core.worker.Sections)
        cluster = is_cluster_url(cfg.broker.url) or bool(getattr(broker, "cluster", False))
        return cls(cfg.run.name, rollout.partitions if rollout else getattr(cfg, "partitions", 1), cluster)

    def _partition(self, i: int, name: str) -> str:
        if self.partitions == 1:
            return self.prefix + name
        return f"streamrl:{self.run}:{{{partition_tag(self.run, i, self.partitions)}}}:{name}"

    @property
    def rollouts(self) -> str:
        """The `rollouts` stream of an unpartitioned run (rollout.partitions=1)."""
        return self._single(self.rollout_streams, "rollouts")

    @property
    def annotations(self) -> str:
        """The `annotations` stream of an unpartitioned run (rollout.partitions=1)."""
        return self._single(self.annotation_streams, "annotations")

    def _single(self, streams: list[str], name: str) -> str:
        if len(streams) > 1:
            raise StreamRLError(
                f"run {self.run!r} has {len(streams)} partitions of `{name}`: pick one with "
                f"{name}_for(group_id) or read all of {name[:-1]}_streams"
            )
        return streams[0]

    def together(self) -> list[list[str]]:
        """The key sets one command or script touches at once: on a cluster each must be one slot
        (brokers.cluster.check_slots checks it before a job starts)."""
        return [
            [self.prompts, self.feeder_admitted],  # admission (streamrl.core.accounting)
            [self.prompts, self.eval_issued],  # eval rounds (streamrl.eval.rounds)
            [self.ledger_groups, self.trainer_released],  # closing a group
            [self.ledger_groups, self.ledger_steps],  # logging a step
            *([r, a] for r, a in zip(self.rollout_streams, self.annotation_streams)),  # join, add-and-ack
        ]

    def partition_of(self, group_id: str) -> int:
        """The partition of a group's rollouts and annotations (stable in every process and language)."""
        return zlib.crc32(group_id.encode()) % self.partitions

    def rollouts_for(self, group_id: str) -> str:
        return self.rollout_streams[self.partition_of(group_id)]

    def annotations_for(self, group_id: str) -> str:
        return self.annotation_streams[self.partition_of(group_id)]

    def worker(self, role: str, worker_id: str) -> str:
        """A worker's heartbeat key; `worker_id` may be a glob (the producer ACL's `name-*`)."""
        return f"{self.workers_prefix}{role}:{worker_id}"

    def episode_state(self, group_id: str) -> str:
        """Hash of a group's episode checkpoints (docs/protocol.md, "Episode state")."""
        return f"{self.prefix}episode_state:{group_id}"

    def observations(self, generator_id: str) -> str:
        """The stream of observations for the episodes generator `generator_id` runs."""
        return f"{self.prefix}observations:{generator_id}"

    def env_steps_of(self, env_worker: str) -> str:
        """Steps routed to one env worker that holds their episodes' state (sticky routing)."""
        return f"{self.env_steps}:{env_worker}"

    def stat(self, name: str) -> str:
        return f"{self.prefix}stats:{name}"

    @property
    def last_group_failure(self) -> str:
        """String: why a generator last gave a group up (streamrl.core.accounting.fail_group)."""
        return self.stat("last_group_failure")
