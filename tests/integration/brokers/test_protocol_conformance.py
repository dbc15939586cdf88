"""docs/protocol.md, statement by statement: a producer that speaks only the wire protocol (raw Redis
commands, msgpack maps built by hand, struct-packed arrays, as a producer in another language would)
against the real trainer-side code (Worker decoding, the Assembler, trimming) on a real redis-server.

Each test names the section of docs/protocol.md it checks.

    pytest tests/integration/brokers/test_protocol_conformance.py
"""

from __future__ import annotations

import asyncio
import json
import struct

import msgpack
import numpy as np
import pytest
import redis.asyncio as aioredis
from redis.exceptions import NoPermissionError, ResponseError

from streamrl.assemble.assembler import GROUP
from streamrl.config.schema import ExternalAnnotation
from streamrl.core.messages import Control, decode
from streamrl.core.trimming import trim_stream
from tests.integration.annotate.test_producers import producer_add
from tests.integration.assemble.test_assembler import make

pytestmark = pytest.mark.anyio


# -- a producer's view: bytes and redis commands ------------------------------------------------
def pack(data: dict) -> bytes:
    return msgpack.packb(data, use_bin_type=True)


def i32(values) -> bytes:
    return struct.pack(f"<{len(values)}i", *values)


def f32(values) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def rollout(gid: str, sample: int, size: int = 2, tokens=(6, 7, 8), nonce: str = "n0", **extra) -> dict:
    """A rollout with only its required fields (plus `extra`)."""
    return {
        "schema": 1,
        "kind": "rollout",
        "rollout_id": f"{gid}:{sample}:{nonce}",
        "group_id": gid,
        "sample": sample,
        "group_size": size,
        "prompt_ids": i32([4, 5]),
        "completion_ids": i32(tokens),
        "logprobs": f32([-1.0] * len(tokens)),
        "version": 0,
        **extra,
    }


def annotation(rid: str, key: str, value, **extra) -> dict:
    return {"schema": 1, "kind": "annotation", "rollout_id": rid, "key": key, "value": value, **extra}


class Wire:
    """Raw redis access to one run, plus the real assembler reading it."""

    def __init__(self, config, broker, **changes):
        self.cfg, self.owner, self.asm = make(config, broker, **changes)
        self.keys = self.owner.keys
        self.r = aioredis.Redis.from_url(config.broker.url)

    async def xadd(self, stream: str, payload: bytes | dict, field: str = "d") -> str:
        blob = pack(payload) if isinstance(payload, dict) else payload
        return (await self.r.xadd(stream, {field: blob})).decode()

    async def group(self, gid: str, rewards, size: int | None = None, **extra) -> None:
        """The group's rollouts and their `reward` annotations, as a generator and a reward worker write them."""
        size = size or len(rewards)
        for i, value in enumerate(rewards):
            await self.xadd(self.keys.rollouts, rollout(gid, i, size))
            await self.xadd(self.keys.annotations, annotation(f"{gid}:{i}:n0", "reward", value, **extra))

    async def dead(self) -> list[tuple[dict, bytes]]:
        out = []
        for _, fields in await self.r.xrange(self.keys.deadletter):
            head, _, payload = fields[b"d"].partition(b"\n")
            out.append((json.loads(head), payload))
        return out

    async def pending(self, stream: str) -> int:
        return {g["name"].decode(): g for g in await self.r.xinfo_groups(stream)}[GROUP]["pending"]

    async def batch(self, timeout: float = 10.0):
        return await asyncio.wait_for(self.asm.next_batch(0), timeout)

    async def polls(self, n: int = 3) -> None:
        for _ in range(n):
            await self.asm.poll()


@pytest.fixture
async def wire(config, broker):
    made: list[Wire] = []

    async def build(**changes) -> Wire:
        w = Wire(config, broker, **{"rollout__groups_per_step": 1, "loss__kl_beta": 0.0, **changes})
        await w.asm.start()
        made.append(w)
        return w

    yield build
    for w in made:
        await w.r.aclose()


# -- Entries, Dead letters ----------------------------------------------------------------------
async def test_entries_carry_one_msgpack_map_in_field_d_and_bad_ones_are_dead_lettered(wire):
    """Entries: one field `d` holding a msgpack map. Dead letters: JSON line + newline + the payload; acked."""
    w = await wire()
    ids = [
        await w.xadd(w.keys.annotations, pack(annotation("g0:0:n0", "reward", 1.0)), field="payload"),
        await w.xadd(w.keys.annotations, b"\xc1\xc1 not msgpack"),
        await w.xadd(w.keys.annotations, msgpack.packb([1, 2, 3])),
    ]
    await w.polls()
    dead = await w.dead()
    assert [rec["entry_id"] for rec, _ in dead] == ids
    for rec, _ in dead:
        assert set(rec) == {"stream", "entry_id", "reason", "worker", "ts"} and rec["stream"] == w.keys.annotations
    reasons = [rec["reason"] for rec, _ in dead]
    assert "no 'd' field" in reasons[0]
    assert "not valid msgpack (" in reasons[1] and "c1 c1" in reasons[1]  # the decoder's error, the bytes
    assert "must be a msgpack map" in reasons[2]
    assert dead[1][1] == b"\xc1\xc1 not msgpack"  # the original payload follows the newline
    assert await w.pending(w.keys.annotations) == 0


async def test_schema_and_kind_are_checked_first(wire):
    """Entries: `schema` must be 1 and `kind` must match the stream; anything else is dead-lettered."""
    w = await wire()
    await w.xadd(w.keys.annotations, {**annotation("g0:0:n0", "reward", 1.0), "schema": 2})
    await w.xadd(w.keys.annotations, {**annotation("g0:0:n0", "reward", 1.0), "kind": "rollout"})
    await w.xadd(w.keys.rollouts, {**rollout("g0", 0), "kind": "annotation"})
    await w.xadd(w.keys.annotations, {**annotation("g0:0:n0", "reward", 1.0), "kind": "telegram"})
    await w.polls()
    reasons = sorted(rec["reason"] for rec, _ in await w.dead())
    assert len(reasons) == 4
    assert sum("does not belong on this stream" in r for r in reasons) == 2
    assert any("unknown schema version 2" in r for r in reasons)
    assert any("unknown message kind 'telegram'" in r for r in reasons)


async def test_required_optional_and_unknown_fields(wire):
    """Entries: a missing required field or a wrong type is dead-lettered, naming the field (and, for
    an annotation, its key and producer); missing optional fields take their defaults; fields the
    schema does not define are ignored."""
    w = await wire()
    for i in range(2):  # only required fields, plus one this schema does not define
        await w.xadd(w.keys.rollouts, rollout("g0", i, tokens=(6, 7), from_the_future=1))
        await w.xadd(w.keys.annotations, annotation(f"g0:{i}:n0", "reward", float(i), confidence=0.9))
    bad = [
        {k: v for k, v in annotation("g0:0:n0", "reward", 1.0, producer="judge-h-1").items() if k != "value"},
        annotation("g0:0:n0", 7, 1.0, producer="judge-h-2"),
        annotation("g0:0:n0", "reward", "0.5", producer="judge-h-3"),
        {k: v for k, v in rollout("g1", 0).items() if k != "logprobs"},
    ]
    for payload in bad:
        await w.xadd(w.keys.annotations if payload["kind"] == "annotation" else w.keys.rollouts, payload)
    batch = await w.batch()
    r = batch.rollouts[0]
    assert (r.finish_reason, r.text, r.prompt_text, r.meta, r.worker, r.version_switches) == (
        "length",
        "",
        "",
        {},
        "",
        [],
    )
    np.testing.assert_allclose(batch.rewards, [0.0, 1.0])
    reasons = {rec["reason"].split(":")[0]: rec["reason"] for rec, _ in await w.dead()}
    assert "missing required field(s) value" in reasons["annotation 'reward' from producer 'judge-h-1' for rollout 'g0"]
    assert "annotation.key must be a string" in reasons["annotation 7 from producer 'judge-h-2' for rollout 'g0"]
    assert (
        "must be a number or float32 bytes" in reasons["annotation 'reward' from producer 'judge-h-3' for rollout 'g0"]
    )
    assert any("rollout is missing required field(s) logprobs" in v for v in reasons.values())
    minimal = decode(pack({"schema": 1, "kind": "control", "action": "stop"}))  # Run end: the stop message
    assert minimal == Control(action="stop", version=-1, reason="")


async def test_arrays_are_packed_little_endian(wire):
    """Arrays: int32 / float32 little-endian `bin`, 4 bytes per element; the doc's example bytes."""
    assert i32([5, 258]) == bytes.fromhex("0500000002010000")
    w = await wire(loss__kl_beta=0.1)
    for i in range(2):
        await w.xadd(w.keys.rollouts, rollout("g0", i, tokens=(5, 258, 70000)))
        await w.xadd(w.keys.annotations, annotation(f"g0:{i}:n0", "reward", 1.0))
        await w.xadd(w.keys.annotations, annotation(f"g0:{i}:n0", "ref_logprobs", f32([-0.5, -1.25, -2.0])))
    batch = await w.batch()
    assert batch.rollouts[0].completion_ids.tolist() == [5, 258, 70000]
    np.testing.assert_array_equal(batch.ref_logprobs[1], np.array([-0.5, -1.25, -2.0], np.float32))


# -- Annotation keys ----------------------------------------------------------------------------
async def test_each_key_accepts_only_its_shape(wire):
    """Annotation keys: reward and external keys take one number in float32 range, ref_logprobs one
    float32 per completion token, any other key anything (never read, acked with its group); a misfit
    is dead-lettered naming key, producer and rollout."""
    w = await wire(**{"annotations__external": [ExternalAnnotation(key="judge", timeout_s=60)], "loss__kl_beta": 0.1})
    for i in range(2):
        await w.xadd(w.keys.rollouts, rollout("g0", i))
    misfits = [
        annotation("g0:0:n0", "reward", f32([1.0]), producer="p-reward"),
        annotation("g0:0:n0", "judge", f32([0.5, 0.5]), producer="p-judge"),
        annotation("g0:0:n0", "judge", 1e39, producer="p-huge"),
        annotation("g0:0:n0", "ref_logprobs", -1.0, producer="p-ref-number"),
        annotation("g0:0:n0", "ref_logprobs", f32([-1.0, -1.0]), producer="p-ref-short"),
    ]
    for a in misfits:
        await w.xadd(w.keys.annotations, a)
    await w.xadd(w.keys.annotations, annotation("g0:0:n0", "notes", f32([1.0, 2.0]), producer="p-notes"))
    for i in range(2):
        for key, value in (("reward", 1.0), ("judge", 0.5), ("ref_logprobs", f32([-1.0] * 3))):
            await w.xadd(w.keys.annotations, annotation(f"g0:{i}:n0", key, value))
    batch = await w.batch()
    assert len(batch) == 2
    dead = {rec["reason"].split(" from producer ")[1].split("'")[1]: rec["reason"] for rec, _ in await w.dead()}
    assert sorted(dead) == ["p-huge", "p-judge", "p-ref-number", "p-ref-short", "p-reward"]  # not p-notes
    assert all(v.startswith("annotation '") and "for rollout 'g0:0:n0': " in v for v in dead.values())
    assert "scalar key" in dead["p-reward"] and "scalar key" in dead["p-judge"]
    assert "float32 range" in dead["p-huge"] and "packed float32 bytes" in dead["p-ref-number"]
    assert "2 values for a completion of 3 tokens" in dead["p-ref-short"]
    await w.asm.commit(batch)
    assert await w.pending(w.keys.annotations) == 0  # the unused key was acked with its group


# -- Annotation semantics -----------------------------------------------------------------------
async def test_first_annotation_per_rollout_and_key_wins(wire):
    """Annotation semantics, idempotency: the first (rollout_id, key) read is kept, later ones acked."""
    w = await wire()
    await w.group("g0", [1.0, 0.0])
    await w.xadd(w.keys.annotations, annotation("g0:0:n0", "reward", -5.0))
    batch = await w.batch()
    await w.polls()
    np.testing.assert_allclose(batch.rewards, [1.0, 0.0])
    await w.asm.commit(batch)
    assert w.asm.counters["duplicates"] == 1 and await w.pending(w.keys.annotations) == 0


async def test_error_annotations_apply_the_policy_at_once_and_are_counted(wire):
    """Annotation semantics, error annotations: external key -> its on_timeout policy now (default:
    the key's default, not a timeout); reward -> the group fails. Each one counts in annotation_errors."""
    w = await wire(annotations__external=[ExternalAnnotation(key="judge", timeout_s=300, default=-1.0)])
    await w.group("g0", [1.0, 1.0])
    await w.xadd(w.keys.annotations, annotation("g0:0:n0", "judge", 0.0, error="judge overloaded"))
    await w.xadd(w.keys.annotations, annotation("g0:1:n0", "judge", 0.25))
    batch = await w.batch(timeout=5)  # no 300 s wait
    np.testing.assert_allclose(batch.reward_components["judge"], [-1.0, 0.25])
    assert batch.stats["annotation_errors"] == 1 and batch.stats["annotation_timeouts"] == 0
    await w.asm.commit(batch)
    await w.xadd(w.keys.rollouts, rollout("h0", 0, size=1))
    await w.xadd(w.keys.annotations, annotation("h0:0:n0", "reward", 0.0, error="reward function raised"))
    await w.polls()
    assert w.asm.counters["failed"] == 1 and w.asm.counters["annotation_errors"] == 2


async def test_timeouts_weighted_reward_and_running_totals(wire):
    """Annotation semantics + Metrics: a timed-out key under `default` counts per (rollout, key) in
    annotation_timeouts; reward_components are unweighted; counters are running totals."""
    w = await wire(annotations__external=[ExternalAnnotation(key="judge", weight=0.5, timeout_s=0.3, default=0.2)])
    totals = []
    for gid in ("g0", "g1"):
        await w.group(gid, [1.0, 0.0])
        await w.xadd(w.keys.annotations, annotation(f"{gid}:0:n0", "judge", 0.8))  # sample 1 never judged
        batch = await w.batch()
        np.testing.assert_allclose(batch.reward_components["judge"], [0.8, 0.2], rtol=1e-6)  # unweighted
        np.testing.assert_allclose(batch.rewards, [1.0 + 0.5 * 0.8, 0.0 + 0.5 * 0.2], rtol=1e-6)
        totals.append(batch.stats["annotation_timeouts"])
        await w.asm.commit(batch)
    assert totals == [1, 2]


async def test_unknown_late_and_duplicate_annotations_are_acked(wire):
    """Unknown, late and duplicate annotations: each is acked and counted under its rule."""
    w = await wire()
    await w.xadd(w.keys.annotations, annotation("ghost:0:n0", "reward", 1.0, producer="p-ghost"))  # rule 4
    await w.group("g0", [1.0, 0.0])
    await w.xadd(w.keys.rollouts, rollout("g0", 1, nonce="n1"))  # a second copy of sample 1: rule 2
    await w.xadd(w.keys.annotations, annotation("g0:1:n1", "reward", 9.0))
    batch = await w.batch()
    await w.polls()
    np.testing.assert_allclose(batch.rewards, [1.0, 0.0])  # the first copy, with its own reward
    assert [r.rollout_id for r in batch.rollouts] == ["g0:0:n0", "g0:1:n0"]
    await w.asm.commit(batch)
    await w.xadd(w.keys.annotations, annotation("g0:0:n0", "reward", 1.0))  # rule 1: after training
    await w.polls()
    c = w.asm.counters
    assert (c["unknown_annotations"], c["duplicates"], c["late"]) == (1, 2, 1)
    assert await w.pending(w.keys.annotations) == 0 and await w.pending(w.keys.rollouts) == 0


async def test_rollout_ids_must_name_group_sample_and_nonce(wire):
    """Rollout ids: `{group_id}:{sample}:{nonce}` for the rollout's own group and sample, else dead-lettered."""
    w = await wire()
    await w.xadd(w.keys.rollouts, {**rollout("g0", 0), "rollout_id": "g0:0"})
    await w.xadd(w.keys.rollouts, {**rollout("g0", 0), "rollout_id": "g9:0:n0"})
    await w.xadd(w.keys.annotations, annotation("g0", "reward", 1.0, producer="p-1"))
    await w.polls()
    reasons = [rec["reason"] for rec, _ in await w.dead()]
    assert len(reasons) == 3 and all("'<group_id>:<sample>:<nonce>'" in r for r in reasons)
    assert reasons[2].startswith("annotation 'reward' from producer 'p-1'")


# -- Trimming -----------------------------------------------------------------------------------
async def test_annotations_are_trimmed_whatever_producers_write(wire):
    """Trimming: `annotations` has only the trainer's group, which acks every annotation."""
    w = await wire()
    for step in range(3):
        await w.group(f"g{step}", [1.0, 0.0])
        for i in range(100):
            await w.xadd(w.keys.annotations, annotation(f"nobody{step}:{i}:n0", "reward", 0.0))
        await w.asm.commit(await w.batch())
    await w.polls()
    await trim_stream(w.asm.broker, w.keys.annotations, [GROUP])
    assert await w.r.xlen(w.keys.annotations) <= 100  # XTRIM MINID ~ keeps at most one partial node


# -- Consumer groups, Security ------------------------------------------------------------------
async def test_producer_user_group_consumer_name_and_takeover(redis_server, broker, run_name):
    """Consumer groups: `producer add` creates the group (BUSYGROUP afterwards); on Redis >= 7 the user
    may write only heartbeats named `<name>-*`; takeover uses the producer's own claim_idle_ms."""
    url = producer_add(redis_server.url, run_name, "judge")
    admin = aioredis.Redis.from_url(redis_server.url)
    user = aioredis.Redis.from_url(url)
    prefix = f"streamrl:{run_name}:"
    try:
        groups = [g["name"].decode() for g in await admin.xinfo_groups(prefix + "rollouts")]
        assert groups == ["judge"]
        with pytest.raises(ResponseError, match="BUSYGROUP"):
            await user.xgroup_create(prefix + "rollouts", "judge", "0", mkstream=True)
        await admin.xadd(prefix + "rollouts", {"d": pack(rollout("g0", 0))})
        got = await user.xreadgroup("judge", "judge-h-1", {prefix + "rollouts": ">"}, count=10)
        assert len(got[0][1]) == 1
        claimed = await user.xautoclaim(prefix + "rollouts", "judge", "judge-h-2", 0, "0-0", count=10)
        assert len(claimed[1]) == 1  # any idle threshold the producer picks: 0 here
        major = int((await admin.info("server"))["redis_version"].split(".")[0])
        if major >= 7:
            assert await user.set(prefix + "workers:producer:judge-h-1", "{}", px=15000)
        else:  # Redis 6.2 cannot grant SET on the heartbeat key alone
            with pytest.raises(NoPermissionError):
                await user.set(prefix + "workers:producer:judge-h-1", "{}", px=15000)
        with pytest.raises(NoPermissionError):
            await user.set(prefix + "workers:producer:other-1", "{}", px=15000)
    finally:
        await user.aclose()
        await admin.aclose()


# -- Key layout: Redis Cluster and partitions ----------------------------------------------------
def doc_crc16(data: bytes) -> int:
    """CRC16-XMODEM as docs/protocol.md states it (poly 0x1021, init 0), table-driven: not streamrl's code."""
    table = []
    for i in range(256):
        c = i << 8
        for _ in range(8):
            c = ((c << 1) ^ 0x1021) & 0xFFFF if c & 0x8000 else (c << 1) & 0xFFFF
        table.append(c)
    crc = 0
    for b in data:
        crc = ((crc << 8) & 0xFFFF) ^ table[((crc >> 8) ^ b) & 0xFF]
    return crc


def doc_partition_streams(run: str, p: int) -> list[tuple[str, str]]:
    """(rollouts, annotations) of each partition, computed from docs/protocol.md alone."""
    out = []
    for i in range(p):
        n = 0
        while not i * 16384 // p + 1 <= doc_crc16(f"{run}:p{i}.{n}".encode()) % 16384 < (i + 1) * 16384 // p - 1:
            n += 1
        tag = f"{run}:p{i}.{n}"
        out.append((f"streamrl:{run}:{{{tag}}}:rollouts", f"streamrl:{run}:{{{tag}}}:annotations"))
    return out


def doc_partition(group_id: str, p: int) -> int:
    import zlib

    return zlib.crc32(group_id.encode()) % p


def test_partitioned_and_cluster_names_follow_the_doc(redis_cluster):
    from streamrl.core.broker import Keys

    assert doc_partition_streams("tiny", 3)[0][0] == "streamrl:tiny:{tiny:p0.2}:rollouts"  # the doc's example
    for run, p in (("tiny", 3), ("job-7.b", 5), ("x", 2), ("run11090", 3)):
        keys = Keys(run, p, cluster=True)
        assert list(zip(keys.rollout_streams, keys.annotation_streams)) == doc_partition_streams(run, p)
        assert keys.prompts == f"streamrl:{run}:{{{run}}}:prompts"
        assert [keys.partition_of(f"g{i}") for i in range(50)] == [doc_partition(f"g{i}", p) for i in range(50)]
    # The server's own slots: each partition in its range; a partition's two streams (and the control keys) in one slot.
    keys = Keys("tiny", 3, cluster=True)
    with redis_cluster.client(redis_cluster.nodes[0].port) as c:
        for i, (r, a) in enumerate(zip(keys.rollout_streams, keys.annotation_streams)):
            slot = c.cluster("keyslot", r)
            assert slot == c.cluster("keyslot", a) and i * 16384 // 3 <= slot < (i + 1) * 16384 // 3
        assert len({c.cluster("keyslot", k) for k in (keys.prompts, keys.feeder_admitted, keys.ledger_groups)}) == 1


async def test_a_group_written_to_its_partition_trains_and_is_acked_there(wire):
    w = await wire(rollout__partitions=3)
    parts = doc_partition_streams(w.cfg.run.name, 3)
    gid = next(g for g in (f"g{i}" for i in range(100)) if doc_partition(g, 3) == 2)
    r_stream, a_stream = parts[2]
    for i, value in enumerate([1.0, 0.0]):
        await w.xadd(r_stream, rollout(gid, i, 2))
        await w.xadd(a_stream, annotation(f"{gid}:{i}:n0", "reward", value))
    batch = await w.batch()
    assert batch.group_ids == [gid]
    await w.asm.commit(batch)
    assert await w.pending(r_stream) == 0 and await w.pending(a_stream) == 0


async def test_an_entry_on_another_partition_is_dead_lettered_naming_its_partition(wire):
    w = await wire(rollout__partitions=3)
    parts = doc_partition_streams(w.cfg.run.name, 3)
    gid = next(g for g in (f"g{i}" for i in range(100)) if doc_partition(g, 3) == 1)
    await w.xadd(parts[0][0], rollout(gid, 0, 2))  # partition 0: wrong
    for _ in range(20):
        await w.polls(1)
        if await w.dead():
            break
    (head, _), *_ = await w.dead()
    assert "partition is 1 of 3" in head["reason"] and await w.pending(parts[0][0]) == 0
