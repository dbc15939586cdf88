"""The `mooncake` weights backend on real processes: a publisher (the trainer's side) and readers
(generators) each with their own transfer engine over loopback TCP, a real redis-server between them.
Every version's tensors hold one value, so a mix of two versions would show (mooncake_procs.py).

pytest tests/integration/weights/test_mooncake.py
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamrl.config.schema import Config
from streamrl.weights.mooncake import decode_spec, wait_fetched
from streamrl.weights.shm import shm_root
from streamrl.weights.store import WeightHandle, WeightStoreError, make_loader, make_publisher
from tests.integration.weights.mooncake_procs import cfg_of, check, next_row, uniform_state

pytest.importorskip(
    "mooncake.engine",
    reason="the mooncake extra: apt-get install libibverbs1 libnl-3-200 "
    "libnl-route-3-200 && pip install 'streamrl[mooncake]'",
)
pytestmark = pytest.mark.anyio

PROCS = [sys.executable, str(Path(__file__).with_name("mooncake_procs.py"))]


@pytest.fixture(autouse=True)
def _no_copies_left(config: Config, tmp_path: Path):
    """The readers' /dev/shm copies (a killed reader leaves its own)."""
    yield
    shutil.rmtree(shm_root(config.run.name, tmp_path), ignore_errors=True)


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}


def _cfg(config: Config, keep: int = 2) -> Config:
    return cfg_of(config.broker.url, config.run.name, keep=keep)


def _reader(config: Config, tmp: Path, min_version: int, *extra: str) -> subprocess.Popen:
    argv = [*PROCS, "read", config.broker.url, config.run.name, str(min_version), "--run-dir", str(tmp), *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=_env())


def _lines(proc: subprocess.Popen, timeout: float = 120) -> list[dict]:
    out, _ = proc.communicate(timeout=timeout)
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


async def test_slot_reused_mid_read_is_discarded_never_mixed(config: Config, broker, tmp_path: Path):
    # keep=1: every publish rewrites the slot a reader is reading. Publishes back to back: filling 128 MB in
    # memory is several times faster than a reader's pull of it over TCP (~0.2-0.3 s on loopback), so reads
    # overlap rewrites on a quiet machine as on a loaded one (a pause between publishes let a quiet
    # machine's reads slip in between).
    pub = make_publisher(_cfg(config, keep=1), broker, None)
    await pub.publish(1, uniform_state(1, 128))
    last = 24
    reader = _reader(config, tmp_path, 1, "--until", str(last))
    next_row(reader, "reading")
    for v in range(2, last + 1):
        await pub.publish(v, uniform_state(v, 128))
    rows = _lines(reader)
    fetched = [r for r in rows if "uniform" in r]
    torn = [r for r in rows if "error" in r]
    assert torn, f"no read overlapped a publish: {rows}"
    assert all("rewritten" in r["error"] or "no longer in its slot" in r["error"] for r in torn), torn
    assert all(r["uniform"] and r["value"] == r["version"] for r in fetched), fetched  # never a mix
    assert fetched and fetched[-1]["version"] == last, rows  # after the torn reads, the newest
    await pub.close()


async def test_reader_killed_mid_read(config: Config, broker, tmp_path: Path):
    pub = make_publisher(_cfg(config), broker, None)
    await pub.publish(1, uniform_state(1, 256))
    victim = _reader(config, tmp_path, 1)
    next_row(victim, "reading")
    time.sleep(0.15)
    victim.send_signal(signal.SIGKILL)
    rest, _ = victim.communicate(timeout=30)
    assert '"uniform"' not in rest, "the reader finished before it was killed; the test needs a longer read"
    # The trainer's side is untouched: the next publish and the next reader go through.
    await pub.publish(2, uniform_state(2, 256))
    rows = _lines(_reader(config, tmp_path, 2))
    assert {"version": 2, "source": "trainer", "uniform": True, "value": 2.0} in rows
    await pub.close()


async def test_trainer_restart_readers_resume_from_next_version(config: Config, broker, tmp_path: Path):
    url, run = config.broker.url, config.run.name
    first = subprocess.Popen(
        [*PROCS, "publish", url, run, "2", "4", "1,2,3"], stdout=subprocess.PIPE, text=True, env=_env()
    )
    old = [next_row(first, "published") for _ in range(3)][-1]["session"]
    loader = make_loader(_cfg(config), broker, tmp_path)
    held, path = await wait_fetched(loader, 3, timeout_s=60)
    assert held.version == 3 and check(path) == {"uniform": True, "value": 3.0}
    first.kill()
    first.wait()
    # The dead trainer's entry names memory that is gone: a clear error, not a hang.
    t0 = time.monotonic()
    with pytest.raises(WeightStoreError, match=old):
        await loader.fetch(WeightHandle(**{**held.to_mapping(), "version": 4}))
    assert time.monotonic() - t0 < 15
    # Restarted from the checkpoint of version 2: it republishes 2 (a new engine), then trains on.
    second = subprocess.Popen(
        [*PROCS, "publish", url, run, "2", "4", "2,3,4"], stdout=subprocess.PIPE, text=True, env=_env()
    )
    new = next_row(second, "published")["session"]
    assert new != old
    latest = await loader.latest()
    assert decode_spec(latest)["session"] == new  # the resumed version replaced the dead trainer's entry
    newest, path = await wait_fetched(loader, held.version + 1, timeout_s=60)
    assert newest.version == 4 and check(path) == {"uniform": True, "value": 4.0}
    second.kill()
    second.wait()
    await loader.close()


async def test_version_collected_before_its_fetch(config: Config, broker, tmp_path: Path):
    pub = make_publisher(_cfg(config), broker, None)
    h1 = await pub.publish(1, uniform_state(1, 1))
    await pub.publish(2, uniform_state(2, 1))
    await pub.publish(3, uniform_state(3, 1))  # keep=2: slot 1 % 2 now holds version 3
    loader = make_loader(_cfg(config), broker, tmp_path)
    with pytest.raises(WeightStoreError, match="version 1 is no longer in its slot .* holds version 3"):
        await loader.fetch(h1)
    newest, path = await wait_fetched(loader, 1, timeout_s=30)
    assert newest.version == 3 and check(path) == {"uniform": True, "value": 3.0}
    await loader.close()
    await pub.close()


async def test_unreachable_engine_names_address_and_setting(config: Config, broker, tmp_path: Path):
    pub = make_publisher(_cfg(config), broker, None)
    h = await pub.publish(1, uniform_state(1, 1))
    spec = decode_spec(h) | {"session": "127.0.0.1:1"}  # nothing listens there
    loader = make_loader(_cfg(config), broker, tmp_path)
    t0 = time.monotonic()
    with pytest.raises(WeightStoreError, match=r"127\.0\.0\.1:1 .*weights\.engine_addr"):
        await loader.fetch(WeightHandle(**{**h.to_mapping(), "handle": json.dumps(spec)}))
    assert time.monotonic() - t0 < 10
    await loader.close()
    await pub.close()


async def test_late_reader_pulls_newest_then_a_peer_serves_a_later_reader_and_falls_back_to_trainer(
    config: Config, broker, tmp_path: Path
):
    pub = make_publisher(_cfg(config), broker, None)
    for v in (1, 2, 3):
        h = await pub.publish(v, uniform_state(v, 8))
    spec = decode_spec(h)
    assert (spec["session"], spec["slot"]) == (pub.engine.session, 3 % 2)
    assert [e[0] for e in spec["entries"]] == ["a.weight", "b.weight"] and h.bytes == spec["length"]
    # A generator started after three publishes: it asks the broker, then reads the trainer's memory (its
    # first read is the newest version, not the first: no rendezvous). It then serves its copy as a peer.
    peer = _reader(config, tmp_path, 1, "--keep-serving", "60")
    assert next_row(peer, "uniform") == {"version": 3, "source": "trainer", "uniform": True, "value": 3.0}
    peers = await broker.hgetall(pub.keys.weights_latest + ":peers")
    (session,) = [k.decode() if isinstance(k, bytes) else k for k, v in peers.items() if v]
    rows = _lines(_reader(config, tmp_path, 1))
    assert {"version": 3, "source": session, "uniform": True, "value": 3.0} in rows  # read from the peer
    peer.kill()
    peer.wait()
    rows = _lines(_reader(config, tmp_path, 1))  # the peer is gone (still announced): the trainer serves
    assert {"version": 3, "source": "trainer", "uniform": True, "value": 3.0} in rows
    await pub.close()


def test_missing_engine_is_a_config_error_naming_the_install(config: Config, monkeypatch):
    # The engine made unimportable in this process (as with the wheel or its libibverbs/libnl missing): a
    # None in sys.modules fails every import of it, already imported or not (was a fresh interpreter, ~5 s).
    from streamrl.launch.preflight import check_weights_engine

    monkeypatch.setitem(sys.modules, "mooncake", None)
    monkeypatch.setitem(sys.modules, "mooncake.engine", None)
    out = check_weights_engine(cfg_of(config.broker.url, "r"))
    assert "weights.backend=mooncake needs the Mooncake Transfer Engine" in out
    assert "apt-get install -y libibverbs1 libnl-3-200 libnl-route-3-200" in out
    assert "pip install 'streamrl[mooncake]'" in out
