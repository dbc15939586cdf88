"""The Mooncake Transfer Engine as the `mooncake` weights backend uses it: one engine per process,
registered byte buffers, one-sided reads, and the slot header (a seqlock) both sides agree on.

    engine = Engine.start(addr)                 # addr: what peers dial; RDMA if the host has RDMA NICs, else TCP
    engine.register(buf)                        # a uint8 tensor others may read
    engine.read(session, local_buf, offset, remote_addr, n)   # one-sided; session = "ip:port" of the peer

Slot layout (a trainer slot, and a generator's receive buffer that it serves to later readers):
[HEADER_BYTES header | packed tensors]. The header is (seq, version, length, magic) as int64s; a writer
makes seq odd, writes, sets version and length, makes seq even. A reader reads the header, the bytes,
and the header again: equal and even means the bytes are one version's, whole (no mix of two).

Install: `pip install 'streamrl[mooncake]'` (the `mooncake-transfer-engine-non-cuda` wheel, or
`mooncake-transfer-engine-cuda13` on a CUDA 13 host) and Debian's `libibverbs1 libnl-3-200
libnl-route-3-200` (the wheel links them even for TCP); `make setup` does both.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

import structlog
import torch

from streamrl.core.errors import ConfigError
from streamrl.weights.store import WeightStoreError

HEADER_BYTES = 64
MAGIC = 0x53524C57  # "SRLW": the bytes behind an address are a streamrl slot
INSTALL = (
    "apt-get install -y libibverbs1 libnl-3-200 libnl-route-3-200 && pip install 'streamrl[mooncake]' (or `make setup`)"
)
CONNECT_TIMEOUT_S = 5.0
"""How long a reader tries to reach a peer's engine before it names the address it could not reach."""


def import_engine():
    """Mooncake's TransferEngine class, or a ConfigError naming the install command."""
    quiet_logs()  # glog reads its settings when the library loads
    try:
        from mooncake.engine import TransferEngine
    except ImportError as exc:  # the wheel missing, or its libibverbs/libnl missing
        raise ConfigError(
            f"weights.backend=mooncake needs the Mooncake Transfer Engine ({exc}); run: {INSTALL}"
        ) from None
    return TransferEngine


def cuda_build() -> bool:
    """The engine's CUDA build is installed (`mooncake-transfer-engine-cuda13` and the like, not
    `-non-cuda`): it can register GPU memory and move it over TCP or GPUDirect RDMA."""
    from importlib.metadata import distributions

    names = {(d.metadata["Name"] or "").lower() for d in distributions()}
    return any(n.startswith("mooncake-transfer-engine") and "non-cuda" not in n for n in names)


def has_rdma() -> bool:
    """An InfiniBand/RoCE device is present (what the engine's RDMA transport needs)."""
    root = Path("/sys/class/infiniband")
    return root.is_dir() and any(root.iterdir())


def route_address(url: str) -> str:
    """The local address this host reaches the broker at `url` from (loopback for an embedded or
    unix-socket broker): where this host's engine is reachable by the other roles' hosts."""
    scheme, _, rest = url.partition("://")
    if not rest or scheme.startswith("unix"):
        return "127.0.0.1"
    first = rest.split("/", 1)[0].rpartition("@")[2].split(",", 1)[0]
    host, _, port = first.rpartition(":")
    host = host.strip("[]") or first
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # no packet is sent: only a route lookup
        s.connect((host, int(port) if port.isdigit() else 6379))
        return s.getsockname()[0]


@dataclass
class Engine:
    """One process's transfer engine and the buffers it registered."""

    te: object
    session: str
    """ip:port peers name to read this engine's buffers."""
    protocol: str
    reached: set[str] = field(default_factory=set)
    """Sessions a connect probe reached (probed once each: the probe's bare connect is logged by the peer)."""

    @classmethod
    def start(cls, addr: str) -> "Engine":
        TransferEngine = import_engine()
        protocol = "rdma" if has_rdma() else "tcp"
        te = TransferEngine()
        # P2PHANDSHAKE: no metadata server; a peer's ip:port is all a reader needs (it comes from the broker).
        rc = te.initialize(addr, "P2PHANDSHAKE", protocol, "")
        if rc != 0:
            raise WeightStoreError(
                f"the Mooncake transfer engine did not start on {addr} over {protocol} (rc={rc}); "
                "check weights.engine_addr names an address of this host"
            )
        session = f"{addr}:{te.get_rpc_port()}"
        structlog.get_logger("streamrl").info(
            "weights_engine_started",
            component="weights",
            session=session,
            protocol=protocol,
            why="RDMA device under /sys/class/infiniband" if protocol == "rdma" else "no RDMA device: TCP",
        )
        return cls(te, session, protocol)

    def register(self, buf: torch.Tensor) -> None:
        location = f"cuda:{buf.device.index or 0}" if buf.device.type == "cuda" else "cpu:0"
        rc = self.te.register_memory(buf.data_ptr(), buf.numel(), location)
        if rc != 0:
            raise WeightStoreError(f"registering {buf.numel()} bytes with the transfer engine failed (rc={rc})")

    def unregister(self, buf: torch.Tensor) -> None:
        self.te.unregister_memory(buf.data_ptr())

    def read(self, session: str, dst: torch.Tensor, remote_addr: int, what: str) -> None:
        """Fill `dst` (inside a registered buffer) from `remote_addr` on `session`, one-sidedly."""
        if session not in self.reached:
            reachable(session, what)
            self.reached.add(session)
        rc = self.te.transfer_sync_read(session, dst.data_ptr(), remote_addr, dst.numel())
        if rc < 0:
            self.reached.discard(session)
            raise WeightStoreError(
                f"reading {what} ({dst.numel()} bytes) from {session} failed (rc={rc}): the process serving it "
                "is gone or restarting; the newest version is fetched next"
            )


def reachable(session: str, what: str) -> None:
    """Raise, naming the address and the setting, when `session`'s engine cannot be reached from
    here (the engine's own connect would wait much longer before failing)."""
    host, _, port = session.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise WeightStoreError(
            f"cannot reach the transfer engine serving {what} at {session} ({exc}); that host advertises "
            "weights.engine_addr (auto: its route to the broker): set it to an address this host can reach, "
            "and let TCP to its port through"
        ) from None


def slot_header(buf: torch.Tensor) -> torch.Tensor:
    """The header of a slot as 8 int64s: seq, version, length, magic (a view: writes go to the slot)."""
    return buf[:HEADER_BYTES].view(torch.int64)


def begin_write(buf: torch.Tensor) -> None:
    h = slot_header(buf)
    h[0] = int(h[0]) | 1  # odd: a reader that saw the previous (even) seq will see it changed
    _settle(buf)


def end_write(buf: torch.Tensor, version: int, length: int) -> None:
    _settle(buf)  # the bytes are in place before the header says so
    h = slot_header(buf)
    h[1], h[2], h[3] = version, length, MAGIC
    _settle(buf)
    h[0] = int(h[0]) + 1  # even again, one generation later
    _settle(buf)


def _settle(buf: torch.Tensor) -> None:
    """A GPU slot's queued writes done (the engine reads device memory outside torch's stream order)."""
    if buf.device.type == "cuda":
        torch.cuda.current_stream(buf.device).synchronize()


def parse_header(raw: torch.Tensor) -> tuple[int, int, int, int]:
    seq, version, length, magic = (int(x) for x in raw[:HEADER_BYTES].view(torch.int64)[:4])
    return seq, version, length, magic


def quiet_logs() -> None:
    """Mooncake logs every handshake at INFO through glog; keep warnings and errors."""
    os.environ.setdefault("GLOG_minloglevel", "1")
