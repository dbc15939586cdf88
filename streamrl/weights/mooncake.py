"""`mooncake` backend: weights across hosts through one-sided reads (Mooncake Transfer Engine), for
generators that come and go; versions stay in the broker, the engine only moves bytes.

Trainer (rank 0): `weights.keep` slots registered with its engine: host memory (pinned where a GPU
is present), or GPU memory where the trainer runs on CUDA and the engine's CUDA build is installed
(the weights are then packed on the GPU one parameter at a time, as `cuda_ipc` does, and never staged
in host memory by the trainer); `publish(v)` packs the tensors into slot v % keep under a seqlock header (mooncake_engine.py) and moves
`weights:latest` to {engine address, slot address, tensor table}. A generator, whenever it likes
(no rendezvous), reads the header, the bytes and the header again into its own registered buffer:
a slot rewritten meanwhile (a later publish, a collected version) is discarded and the newest
version fetched next (the generator's loop), so a mix of two versions is never loaded. It then
writes the tensors once to this host's shared memory and vLLM reloads them like the `shm` backend.

Fan-out (`weights.serve_peers`): a generator's buffer keeps the version it read, under the same
header, and it announces itself in the broker hash `weights:peers`; readers of that version read from
a peer first (one at random), falling back to the trainer, so N generators need not all share the
trainer's NIC. Each holder serves one reader of a version at a time (a claim in the broker, renewed
while the read goes on): readers that start together wait for a free holder, and each finished read
adds one, a doubling tree. A peer that has moved on or gone is detected by the header or the connect.

Trust boundary: each engine listens on TCP (its handshake port and its data port, RDMA where the
host has NICs). Mooncake binds those listeners to every address of the host whatever address it is
given (its source hard-codes the wildcard; no setting names an address: docs/multihost.md says
where); `weights.engine_addr` only chooses the address it advertises. Both ports come from
MC_MIN_RPC_PORT..MC_MAX_RPC_PORT (default 15000-17000), the range a firewall rule admits. Anyone who reaches those ports can read every registered buffer (the weights) and, the
engine having no authentication, write into them. Run it on a private network (docs/multihost.md).

    streamrl up --set weights.backend=mooncake
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import shutil
import threading
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from streamrl.config.schema import Config
from streamrl.core.broker import Broker, Keys
from streamrl.weights.cuda_ipc import PackedState, buffer_layout
from streamrl.weights.files import WEIGHTS_FILE, version_dirs
from streamrl.weights.lora import write_peft_dir
from streamrl.weights.mooncake_engine import (
    HEADER_BYTES,
    MAGIC,
    Engine,
    begin_write,
    cuda_build,
    end_write,
    import_engine,
    parse_header,
    route_address,
)
from streamrl.weights.shm import shm_root
from streamrl.weights.store import WeightHandle, WeightLoader, WeightPublisher, WeightStoreError

SPEC_VERSION = 1
CLAIM_TTL_S = 3.0
"""A reader's claim on a source lives this long unless renewed (every third of it while the read goes on)."""
CLAIM_WAIT_S = 120.0
"""A reader waits at most this long for a free source, then reads the trainer alongside the others."""
CLAIM_POLL_S = 0.05
CLAIM = "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end return 0"
RENEW = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"
RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


def engine_address(cfg: Config, broker: Broker) -> str:
    """weights.engine_addr resolved on this host (`auto`: the address of its route to the broker this
    process is connected to, which `streamrl worker --broker` may give instead of broker.url)."""
    addr = cfg.weights.engine_addr
    return route_address(getattr(broker, "url", "") or cfg.broker.url) if addr == "auto" else addr


def _tensors(buf: torch.Tensor, entries) -> dict[str, torch.Tensor]:
    out = {}
    for name, dtype, shape, off in entries:
        dt = getattr(torch, dtype)
        n = dt.itemsize
        for s in shape:
            n *= int(s)
        out[name] = buf[off : off + n].view(dt).view(shape)
    return out


def gpu_slots() -> bool:
    """Slots in GPU memory: this trainer process has a GPU and the engine can register its memory."""
    return torch.cuda.is_available() and cuda_build()


class MooncakePublisher(WeightPublisher):
    transport = "mooncake"

    @classmethod
    def snapshot(cls, source, dtype: str):
        """GPU slots: the weight stream packed on this rank's GPU (one parameter gathered at a time, the
        only stall); else the engine's full state dict in host memory (the file backends' snapshot)."""
        if not gpu_slots():
            return source.full_state_dict()
        from streamrl.weights.cuda_ipc_publish import pack_stream

        device = torch.device("cuda", torch.cuda.current_device())
        return pack_stream(source.weight_stream(), device, getattr(torch, dtype))

    @classmethod
    def from_config(cls, cfg: Config, broker: Broker, run_dir: Path | None) -> "MooncakePublisher":
        import_engine()
        return cls(broker, Keys.of(cfg), cfg.weights.keep, engine_address(cfg, broker))

    def __init__(self, broker: Broker, keys: Keys, keep: int, addr: str):
        super().__init__(broker, keys, keep)
        self.engine = Engine.start(addr)
        self.slots: list[torch.Tensor] = []
        self.held: dict[int, int] = {}
        """slot index -> the version it holds."""

    def _slots_for(self, nbytes: int) -> list[torch.Tensor]:
        if self.slots and self.slots[0].numel() >= HEADER_BYTES + nbytes:
            return self.slots
        for buf in self.slots:  # a larger version (first publish, or an adapter grew): new slots
            self.engine.unregister(buf)
        if gpu_slots():
            device = torch.device("cuda", torch.cuda.current_device())
            self.slots = [
                torch.zeros(HEADER_BYTES + nbytes, dtype=torch.uint8, device=device) for _ in range(self.keep)
            ]
        else:
            pin = torch.cuda.is_available()  # pinned host memory where a GPU copies into it
            self.slots = [
                torch.zeros(HEADER_BYTES + nbytes, dtype=torch.uint8, pin_memory=pin) for _ in range(self.keep)
            ]
        for buf in self.slots:
            self.engine.register(buf)
        self.held.clear()
        return self.slots

    def _write(self, version: int, state: dict[str, torch.Tensor] | PackedState, adapter: str = "") -> tuple[str, int]:
        if isinstance(state, PackedState):  # packed on the GPU by snapshot
            entries, nbytes = state.entries, state.buffer.numel()
        else:
            entries, nbytes = buffer_layout([(n, t.dtype, list(t.shape)) for n, t in state.items()])
        index = version % self.keep
        slot = self._slots_for(nbytes)[index]
        begin_write(slot)
        self.held.pop(index, None)
        data = slot[HEADER_BYTES:]
        if isinstance(state, PackedState):
            data[:nbytes].copy_(state.buffer)
        else:
            for (_, _, _, off), t in zip(entries, state.values()):
                flat = t.detach().contiguous().view(-1).view(torch.uint8)
                data[off : off + flat.numel()].copy_(flat)
        end_write(slot, version, nbytes)
        self.held[index] = version
        spec = {"v": SPEC_VERSION, "session": self.engine.session, "addr": slot.data_ptr(), "slot": index}
        spec |= {"length": nbytes, "entries": entries}
        return json.dumps(spec), nbytes

    async def _advance(self, wh: WeightHandle) -> None:
        # An entry naming another engine was left by a trainer that is gone (one publisher per run): its
        # memory went with it, so this process's version replaces it even when not newer (a resume).
        current = await self.latest()
        if current is not None and wh.version <= current.version and _session(current) != self.engine.session:
            await self.broker.hset(self.keys.weights_latest, wh.to_mapping())
            await self.broker.add(self.keys.weights_published, str(wh.version).encode(), maxlen=16)
            return
        await super()._advance(wh)

    def _versions(self) -> list[int]:
        return list(self.held.values())

    def _collect(self, keep_versions: set[int]) -> list[int]:
        # Slots are reused, never freed: a version is gone once the publish of version + keep rewrites it.
        return []

    async def close(self) -> None:
        for buf in self.slots:
            self.engine.unregister(buf)


def _session(handle: WeightHandle) -> str:
    try:
        return json.loads(handle.handle)["session"]
    except (ValueError, KeyError, TypeError):
        return ""


def decode_spec(handle: WeightHandle) -> dict:
    try:
        spec = json.loads(handle.handle)
    except ValueError:
        spec = {}
    if spec.get("v") != SPEC_VERSION:
        raise WeightStoreError(
            f"weights:latest of version {handle.version} is not a mooncake v{SPEC_VERSION} entry; run one streamrl "
            "version on every role"
        )
    return spec


class MooncakeLoader(WeightLoader):
    transport = "mooncake"

    @classmethod
    def from_config(cls, cfg: Config, broker: Broker, run_dir: Path | None) -> "MooncakeLoader":
        import_engine()
        return cls(
            broker, Keys.of(cfg), shm_root(cfg.run.name, run_dir), engine_address(cfg, broker), cfg.weights.serve_peers
        )

    def __init__(self, broker: Broker, keys: Keys, cache_root: Path, addr: str, serve_peers: bool = True):
        super().__init__(broker, keys)
        self.addr = addr
        self.serve_peers = serve_peers
        self.peers_key = keys.weights_latest + ":peers"
        self.cache_dir = Path(cache_root) / f"fetched-{os.getpid()}"
        self.engine: Engine | None = (
            None  # started at the first fetch: a generator that never fetches listens on nothing
        )
        self.buf: torch.Tensor | None = None
        """[header | tensors]: what was read last, served to peers under the same seqlock header."""
        self.head = torch.zeros(2 * HEADER_BYTES, dtype=torch.uint8)
        self.lock = threading.Lock()
        self.token = secrets.token_hex(8)
        """Names this reader's claims on a source (released only by their holder)."""
        self._sources: list[tuple[str, int]] | None = None
        self.last_source = ""
        """Where the last fetch read from: `trainer` or a peer's session (tests, bench)."""

    def _buffer(self, nbytes: int) -> torch.Tensor:
        if self.engine is None:
            self.engine = Engine.start(self.addr)
            self.engine.register(self.head)
        if self.buf is None or self.buf.numel() < HEADER_BYTES + nbytes:
            if self.buf is not None:
                self.engine.unregister(self.buf)
            self.buf = torch.zeros(HEADER_BYTES + nbytes, dtype=torch.uint8)
            self.engine.register(self.buf)
        return self.buf

    async def fetch(self, handle: WeightHandle) -> str:
        self._sources = None
        if (
            not self.serve_peers
            or handle.transport != self.transport
            or handle.is_adapter  # an adapter is small and not served on: read from the trainer
            or (self.cache_dir / f"v{handle.version}").is_dir()
        ):
            return await super().fetch(handle)
        spec = decode_spec(handle)
        self._sources, claim = await self._claim_source(handle, (spec["session"], spec["addr"]))
        renew = asyncio.create_task(self._renew(claim)) if claim else None
        try:
            local = await super().fetch(handle)
            # Announced before the claim goes: a reader waiting for a free source sees this one at once.
            entry = json.dumps({"version": handle.version, "addr": self.buf.data_ptr()})
            await self.broker.hset(self.peers_key, {self.engine.session: entry})
        finally:
            if renew is not None:
                renew.cancel()
                await self.broker.script(RELEASE, [claim], [self.token])
        return local

    async def _peers_holding(self, version: int) -> list[tuple[str, int]]:
        """Announced peers that hold `version` (other than this process), in random order."""
        peers = []
        for session, value in (await self.broker.hgetall(self.peers_key)).items():
            session = session.decode() if isinstance(session, bytes) else session
            entry = json.loads(value) if value else {}
            if entry.get("version") == version and session != getattr(self.engine, "session", ""):
                peers.append((session, int(entry["addr"])))
        random.shuffle(peers)
        return peers

    async def _claim_source(self, handle: WeightHandle, trainer: tuple[str, int]) -> tuple[list, str | None]:
        """Sources of `handle` in the order to try them, the first one claimed for this read (its claim key).

        Each holder of a version (a peer, the trainer) serves one reader of it at a time: readers that start
        together do not all share the trainer's NIC; they wait for a holder to be free, and every finished
        read adds one (a doubling tree: N readers are ready after ~log2(N+1) reads, not N reads through
        one NIC). A claim is a broker key with a short TTL, renewed while the read goes on: a reader
        killed mid-read frees its source within CLAIM_TTL_S."""
        deadline = time.monotonic() + CLAIM_WAIT_S
        while True:
            peers = await self._peers_holding(handle.version)
            candidates = [*peers, trainer]  # a free peer before the trainer
            for i, (session, _) in enumerate(candidates):
                key = f"{self.peers_key}:claim:{session}:{handle.version}"
                if await self.broker.script(CLAIM, [key], [self.token, int(CLAIM_TTL_S * 1000)]):
                    return [candidates[i], *candidates[:i], *candidates[i + 1 :]], key
            newest = await self.latest()
            if newest is not None and newest.version > handle.version:
                raise WeightStoreError(
                    f"weights version {handle.version} was superseded by {newest.version} while this reader waited "
                    "for a free source; the newest is fetched next"
                )
            if time.monotonic() > deadline:  # every holder busy this long: read the trainer alongside them
                return candidates[::-1], None
            await asyncio.sleep(CLAIM_POLL_S)

    async def _renew(self, claim: str) -> None:
        while True:
            await asyncio.sleep(CLAIM_TTL_S / 3)
            await self.broker.script(RENEW, [claim], [self.token, int(CLAIM_TTL_S * 1000)])

    def _fetch(self, handle: WeightHandle) -> str:
        dst = self.cache_dir / f"v{handle.version}"
        if dst.is_dir():
            return str(dst)
        spec = decode_spec(handle)
        with self.lock:
            buf = self._buffer(spec["length"])
            begin_write(buf)  # peers reading the previous version from here see it change
            error = None
            for session, addr in self._sources or [(spec["session"], spec["addr"])]:
                try:
                    self._read_slot(session, addr, handle.version, spec["length"])
                    self.last_source = "trainer" if session == spec["session"] else session
                    break
                except WeightStoreError as exc:
                    error = exc  # a peer moved on or left: the next one, then the trainer
            else:
                raise error
            state = _tensors(buf[HEADER_BYTES:], spec["entries"])
            self._materialise(handle, dst, state)
            end_write(buf, handle.version, spec["length"])
        return str(dst)

    def _read_slot(self, session: str, addr: int, version: int, nbytes: int) -> None:
        """Read version `version` from the slot at `addr` on `session` into self.buf, or raise (torn, reused)."""
        first, second = self.head[:HEADER_BYTES], self.head[HEADER_BYTES:]
        what = f"weights version {version}"
        self.engine.read(session, first, addr, what)
        seq, held, length, magic = parse_header(first)
        if magic != MAGIC or held != version or seq % 2 or length != nbytes:
            raise WeightStoreError(
                f"{what} is no longer in its slot at {session} (it holds version {held}"
                f"{', being rewritten' if seq % 2 else ''}): collected before this fetch; the newest is fetched next"
            )
        self.engine.read(session, self.buf[HEADER_BYTES : HEADER_BYTES + nbytes], addr + HEADER_BYTES, what)
        self.engine.read(session, second, addr, what)
        if not torch.equal(first, second):
            raise WeightStoreError(
                f"{what} was rewritten at {session} while it was read (now version {parse_header(second)[1]}); "
                "the read is discarded and the newest is fetched next"
            )

    def _materialise(self, handle: WeightHandle, dst: Path, state: dict[str, torch.Tensor]) -> None:
        tmp = self.cache_dir / f".tmp-v{handle.version}-{time.monotonic_ns()}"
        tmp.mkdir(parents=True)
        try:
            if handle.is_adapter:
                write_peft_dir(tmp, state, handle.adapter)
            else:
                save_file(state, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
            os.rename(tmp, dst)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        local = version_dirs(self.cache_dir)
        for v in sorted(local)[: -self.local_copies]:
            if v != handle.version:
                shutil.rmtree(local[v], ignore_errors=True)

    async def close(self) -> None:
        if self.engine is not None and self.serve_peers:
            await self.broker.hset(self.peers_key, {self.engine.session: ""})  # gone: readers skip it at once
        shutil.rmtree(self.cache_dir, ignore_errors=True)


async def wait_fetched(loader: MooncakeLoader, version: int, timeout_s: float) -> tuple[WeightHandle, str]:
    """Fetch the newest version >= `version`, reading again after a torn or collected read (what a
    generator's weight loop does); for tests and the bench."""
    deadline = time.monotonic() + timeout_s
    while True:
        newest = await loader.latest()
        if newest is not None and newest.version >= version:
            try:
                return newest, await loader.fetch(newest)
            except WeightStoreError:
                if time.monotonic() > deadline:
                    raise
        elif time.monotonic() > deadline:
            raise WeightStoreError(f"version {version} was not published within {timeout_s} s")
        await asyncio.sleep(0.05)
