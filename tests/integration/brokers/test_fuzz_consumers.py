"""Property test: random and corrupted messages fed to every consumer land in the dead-letter stream
with a reason, and no consumer crashes (then a good message is still processed).

Generator, reward and reference run as real `streamrl worker` processes (real vLLM CPU engine,
real tiny model) against the session's redis-server; the assembler (inside the trainer) runs
in-process. The feeder reads no stream.

    pytest tests/integration/brokers/test_fuzz_consumers.py
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import msgpack
import numpy as np
import pytest
import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from streamrl.assemble.assembler import Assembler
from streamrl.core.broker import Keys
from streamrl.core.messages import MAX_ENTRY_BYTES, Annotation, Prompt, Rollout, encode
from streamrl.core.worker import Worker
from streamrl.models.tiny import vocab

REPO = Path(__file__).resolve().parents[3]
VOCAB = len(vocab())
OVERSIZED = b"\x00" * (MAX_ENTRY_BYTES + 1)
SETTINGS = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# -- strategies: payloads that must not decode, or decode into something the consumer must refuse --
def _prompt(**kw) -> dict:
    base = dict(group_id="gz", prompt_ids=np.array([5, 6, 7]), group_size=2, admitted_version=0, text="abc")
    return {**base, **kw}


def _rollout(**kw) -> dict:
    base = dict(
        rollout_id="gz:0:f0",
        group_id="gz",
        sample=0,
        group_size=2,
        prompt_ids=np.array([5, 6]),
        completion_ids=np.array([7, 8]),
        logprobs=np.array([-1.0, -2.0]),
        version=0,
        text="xy",
    )
    return {**base, **kw}


def _mutate(blob: bytes, field: str, value) -> bytes:
    data = msgpack.unpackb(blob, raw=False)
    if value is _DROP:
        data.pop(field, None)
    else:
        data[field] = value
    return msgpack.packb(data, use_bin_type=True)


_DROP = object()
ints = st.integers(-(2**63), 2**63 - 1)  # what msgpack can carry
junk = st.one_of(
    st.binary(max_size=200),
    st.dictionaries(
        st.text(max_size=8), st.one_of(ints, st.text(max_size=8), st.none(), st.binary(max_size=8)), max_size=6
    ).map(lambda d: msgpack.packb(d, use_bin_type=True)),
)


odd_bytes = st.binary(min_size=1, max_size=7).filter(lambda b: len(b) % 4 != 0)
WRONG = {  # values of the wrong type (or NaN) for each kind of required field
    "str": st.one_of(ints, st.none(), st.lists(ints, max_size=2)),
    "int": st.one_of(st.text(max_size=4), st.none(), st.floats(allow_nan=True), st.lists(ints, max_size=2)),
    "array": st.one_of(st.text(max_size=4), ints, st.lists(ints, max_size=2), odd_bytes),
    "value": st.one_of(st.text(max_size=4), st.none(), st.sampled_from([math.nan, math.inf, -math.inf]), odd_bytes),
}


def corrupted(valid: bytes, fields: dict[str, str]) -> st.SearchStrategy[bytes]:
    """A valid message of the consumer's kind with one thing broken (schema, kind, a field, the bytes)."""
    wrong_field = st.sampled_from(sorted(fields)).flatmap(
        lambda f: WRONG[fields[f]].map(lambda v: _mutate(valid, f, v))
    )
    return st.one_of(
        st.sampled_from([2, 0, -1, "1", None]).map(lambda v: _mutate(valid, "schema", v)),
        st.sampled_from(["bogus", "control", "", 7]).map(lambda v: _mutate(valid, "kind", v)),
        st.sampled_from(sorted(fields)).map(lambda f: _mutate(valid, f, _DROP)),
        wrong_field,
        st.integers(1, len(valid) - 1).map(lambda n: valid[:n]),
    )


def semantic(kind: str) -> st.SearchStrategy[bytes]:
    """Well-formed messages the given consumer still cannot use."""
    bad_ids = st.sampled_from([np.array([VOCAB + 5]), np.array([-3, 4]), np.array([2**30])])
    if kind == "generator":
        return st.one_of(
            st.just(encode(Prompt(**_prompt(prompt_ids=np.array([], np.int32))))),
            bad_ids.map(lambda ids: encode(Prompt(**_prompt(prompt_ids=ids)))),
            st.just(encode(Prompt(**_prompt(group_size=10**6)))),
            st.integers(10**6, 10**9).map(lambda v: encode(Prompt(**_prompt(admitted_version=v)))),
        )
    if kind == "reference":
        return bad_ids.map(lambda ids: encode(Rollout(**_rollout(completion_ids=ids, logprobs=np.zeros(len(ids))))))
    if kind == "assembler":
        return st.one_of(
            bad_ids.map(lambda ids: encode(Rollout(**_rollout(completion_ids=ids, logprobs=np.zeros(len(ids)))))),
            st.just(encode(Rollout(**_rollout(rollout_id="other:0:f0")))),
            st.just(encode(Rollout(**_rollout(prompt_ids=np.array([], np.int32))))),
            st.just(encode(Annotation(rollout_id="gz:0:f0", key="reward", value=np.ones(3, np.float32)))),
            st.just(encode(Annotation(rollout_id="gz:0:f0", key="ref_logprobs", value=0.5))),
        )
    return st.nothing()


NAN_LOGPROBS = _mutate(encode(Rollout(**_rollout())), "logprobs", np.array([math.nan, 0.0], "<f4").tobytes())
NAN_REWARD = _mutate(encode(Annotation(rollout_id="gz:0:f0", key="reward", value=1.0)), "value", math.nan)
VALID = {
    "generator": encode(Prompt(**_prompt())),
    "reward": encode(Rollout(**_rollout())),
    "reference": encode(Rollout(**_rollout())),
}
FIELDS = {
    "generator": {"group_id": "str", "prompt_ids": "array", "group_size": "int", "admitted_version": "int"},
    "reward": {
        "rollout_id": "str",
        "group_id": "str",
        "sample": "int",
        "group_size": "int",
        "prompt_ids": "array",
        "completion_ids": "array",
        "logprobs": "array",
        "version": "int",
    },
}
FIELDS["reference"] = FIELDS["reward"]


def payloads(kind: str, valid: bytes, fields: dict[str, str]) -> st.SearchStrategy[list[bytes]]:
    return st.lists(st.one_of(junk, corrupted(valid, fields), semantic(kind)), min_size=1, max_size=6)


# -- the consumers ------------------------------------------------------------------------------
def _dead(r: redis.Redis, keys: Keys, worker: str) -> dict[str, str]:
    """entry id -> reason of every dead-letter record `worker` wrote."""
    out = {}
    for _, fields in r.xrange(keys.deadletter):
        rec = json.loads(fields[b"d"].split(b"\n", 1)[0])
        if rec["worker"] == worker:
            out[rec["entry_id"]] = rec["reason"]
    return out


@pytest.fixture(scope="module")
def workers(redis_server, tmp_path_factory):
    """generator-0, reward-0, reference-0 as `streamrl worker` processes of one fresh run."""
    tmp = tmp_path_factory.mktemp("fuzz")
    run = f"fuzz-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "STREAMRL_CACHE": str(tmp / "cache"), "PYTHONUNBUFFERED": "1"}
    sets = [
        "--set",
        "generator.max_tokens=4",
        "--set",
        "reward.timeout_s=2",
        "--set",
        "broker.claim_idle_ms=2000",
        "--set",
        "loss.kl_beta=0.001",
        "--set",
        "generator.drain_timeout_s=1",
    ]
    procs = {}
    for role in ("generator", "reward", "reference"):
        out = open(tmp / f"{role}.out", "wb")
        procs[role] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "streamrl.cli",
                "worker",
                role,
                "--broker",
                redis_server.url,
                "--run",
                run,
                "--id",
                f"{role}-0",
                "--run-dir",
                str(tmp),
                *sets,
            ],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    r = redis.Redis.from_url(redis_server.url)
    keys = Keys(run)
    deadline = time.time() + 400
    while not all(r.exists(keys.worker(role, f"{role}-0")) for role in procs):
        dead = [role for role, p in procs.items() if p.poll() is not None]
        assert not dead and time.time() < deadline, (
            f"{dead} did not start: " + (tmp / f"{dead[0] if dead else 'generator'}.out").read_text()[-3000:]
        )
        time.sleep(0.5)
    yield r, keys, procs, tmp
    for p in procs.values():
        p.terminate()
    for p in procs.values():
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
    r.close()


def _feed_and_check(workers, role: str, stream: str, items: list[bytes]) -> None:
    r, keys, procs, tmp = workers
    ids = [r.xadd(stream, {"d": p}).decode() for p in items]
    ids.append(r.xadd(stream, {"x": b"no d field"}).decode())
    deadline = time.time() + 60
    while True:
        dead = _dead(r, keys, f"{role}-0")
        assert procs[role].poll() is None, f"{role} crashed:\n" + (tmp / f"{role}.out").read_text()[-3000:]
        if all(i in dead for i in ids):
            break
        assert time.time() < deadline, f"not dead-lettered: {[i for i in ids if i not in dead]}"
        time.sleep(0.1)
    assert all(dead[i] for i in ids), "every dead-letter record names a reason"


@SETTINGS
@given(items=payloads("generator", VALID["generator"], FIELDS["generator"]))
@example(items=[OVERSIZED])
def test_generator_dead_letters_bad_prompts(workers, items):
    _feed_and_check(workers, "generator", workers[1].prompts, items)


@SETTINGS
@given(items=payloads("reward", VALID["reward"], FIELDS["reward"]))
@example(items=[OVERSIZED, NAN_LOGPROBS])
def test_reward_dead_letters_bad_rollouts(workers, items):
    _feed_and_check(workers, "reward", workers[1].rollouts, items)


@SETTINGS
@given(items=payloads("reference", VALID["reference"], FIELDS["reference"]))
@example(items=[OVERSIZED])
def test_reference_dead_letters_bad_rollouts(workers, items):
    _feed_and_check(workers, "reference", workers[1].rollouts, items)


def test_consumers_still_work_after_fuzzing(workers):
    """A good prompt is generated, scored and referenced after all the garbage."""
    r, keys, procs, _ = workers
    prompt = Prompt(**_prompt(group_id=f"ok{uuid.uuid4().hex[:4]}", meta={"chars": "abc", "length": 4}))
    r.xadd(keys.prompts, {"d": encode(prompt)})
    want = {f"{prompt.group_id}:{s}" for s in range(prompt.group_size)}
    deadline, got = time.time() + 120, set()
    while time.time() < deadline and len(got) < 2 * len(want):
        from streamrl.core.messages import decode, sample_key

        got = {
            (sample_key(a.rollout_id), a.key)
            for _, f in r.xrange(keys.annotations)
            if b"d" in f
            for a in [decode(f[b"d"])]
            if sample_key(a.rollout_id) in want and not a.error
        }
        time.sleep(0.2)
    assert got == {(rid, k) for rid in want for k in ("reward", "ref_logprobs")}
    assert all(p.poll() is None for p in procs.values())


# -- the assembler (in the trainer process), in-process on one event loop ---------------------------
class _Owner(Worker):
    role = "trainer"


@pytest.fixture(scope="module")
def assembler(redis_server):
    from brokers.connect import connect
    from streamrl.config.schema import BrokerConfig, Config, RunConfig

    loop = asyncio.new_event_loop()
    broker = loop.run_until_complete(connect(redis_server.url, retries=3))
    cfg = Config(
        run=RunConfig(name=f"fuzzasm-{uuid.uuid4().hex[:6]}"),
        broker=BrokerConfig(url=redis_server.url, claim_idle_ms=200, block_ms=20),
    )
    owner = _Owner(cfg, broker, "trainer-0")
    asm = Assembler(cfg, broker, owner.log, owner.count, consumer="trainer-0")
    asm.vocab_size = VOCAB
    loop.run_until_complete(asm.start())
    yield loop, broker, asm
    loop.run_until_complete(broker.close())
    loop.close()


ROLLOUT_OR_ANNOTATION = st.one_of(
    junk,
    corrupted(VALID["reward"], FIELDS["reward"]),
    semantic("assembler"),
    corrupted(
        encode(Annotation(rollout_id="gz:0:f0", key="reward", value=1.0)),
        {"rollout_id": "str", "key": "str", "value": "value"},
    ),
)


@SETTINGS
@given(
    items=st.lists(
        st.tuples(st.sampled_from(["rollouts", "annotations"]), ROLLOUT_OR_ANNOTATION), min_size=1, max_size=6
    )
)
@example(items=[("rollouts", OVERSIZED), ("annotations", NAN_REWARD), ("rollouts", NAN_LOGPROBS)])
def test_assembler_dead_letters_bad_entries(assembler, items):
    loop, broker, asm = assembler
    keys = asm.keys

    async def body():
        ids = [await broker.add(getattr(keys, stream), payload) for stream, payload in items]
        for _ in range(50):
            await asm.poll()
            dead = {
                json.loads(e.data.split(b"\n", 1)[0])["entry_id"]
                for e in await broker.read(keys.deadletter, count=10**6)
            }
            if all(i in dead for i in ids):
                return
        raise AssertionError(f"not dead-lettered: {[i for i in ids if i not in dead]}")

    loop.run_until_complete(body())
