"""The broker protocol every role talks through, and the run's key names.

Implementations live in `brokers/` (Redis Streams; the embedded launcher). Roles receive a
broker instance in their constructor; nothing here is global.

    broker = await connect(url)              # brokers.redis_streams.RedisBroker
    keys = Keys("tiny")                      # keys.rollouts == "streamrl:tiny:rollouts"
    await broker.ensure_group(keys.rollouts, "reward")
    for entry in await broker.read_group(keys.rollouts, "reward", "reward-0", count=64):
        ...; await broker.ack(keys.rollouts, "reward", [entry.id])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


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


class Keys:
    """Every key name of one run, `streamrl:{run}:...` (docs/protocol.md, "Keys"): code builds no key
    string of its own (tests/unit/test_keys.py), so a rename here is a rename everywhere."""

    def __init__(self, run: str):
        self.run = run
        p = f"streamrl:{run}:"
        self.prefix = p
        self.prompts = p + "prompts"
        self.rollouts = p + "rollouts"
        self.annotations = p + "annotations"
        self.control = p + "control"
        self.metrics = p + "metrics"
        self.deadletter = p + "deadletter"
        self.weights_latest = p + "weights:latest"
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
