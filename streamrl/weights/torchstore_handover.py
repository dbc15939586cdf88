"""How a process joins the torchstore another process serves (`weights.backend: torchstore`, experimental).

torchstore keeps its keys in a controller actor and its tensors in storage-volume actors, all Monarch
actors spawned by the process that starts the store (trainer rank 0). Any other process that holds a
reference to the controller, and whose own Monarch listener the store's processes can reach, reads the
store: the controller names the volumes, a volume sends the tensors back over Monarch's TCP channel
(RDMA where built and present). So the publisher pickles its controller reference into the broker hash
`weights:torchstore`, the way torchstore's own SPMD path (`torchstore.spmd.initialize`, newer than
0.1.2) hands it to its other ranks through a TCPStore, and a separately started reader unpickles it.

Every process first binds Monarch's listener to `weights.torchstore_addr` (TCP; the publisher on
`weights.torchstore_port`, a reader on a free port); the store's own child processes listen on unix
sockets only, reached through that one TCP listener.

The private names this rests on (torchstore 0.1.2, torchmonarch 0.6.0), any of which may change:
`torchstore.client.LocalClient(controller, strategy)` and `torchstore.state_dict_utils.get_state_dict`
(a reader must not call `torchstore.initialize`/`client`, which would spawn a store of its own), the
pickled form of a Monarch `ActorMesh` (`monarch._src.actor.actor_mesh`, rebuilt through
`monarch._rust_bindings`), the `_method` of torchstore's Controller endpoints (AsyncController), and
`monarch._src.actor.config.prefix_python_logs_with_actor` (bind_listener says why).
"""

from __future__ import annotations

import asyncio
import io
import pickle

from monarch._src.actor import config as actor_config
from monarch.actor import enable_transport, endpoint
from torchstore.client import LocalClient
from torchstore.controller import Controller

from streamrl.core.broker import Broker, Keys
from streamrl.core.errors import ConfigError
from streamrl.weights.store import WeightStoreError

CONNECT_TIMEOUT_S = 30.0
"""How long a reader waits for the store's controller to answer before naming the address it could not reach."""


def _async_endpoint(name: str):
    sync = Controller.__dict__[name]._method

    async def method(self, *args, **kwargs):
        return sync(self, *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    return endpoint(method)


class AsyncController(Controller):
    """torchstore 0.1.2's Controller with its five sync endpoints re-declared async.

    Why: torchmonarch >= 0.2 refuses an actor that mixes sync and async endpoints ("Controller mixes
    both async and sync endpoints"), so `torchstore.initialize()` fails on the Monarch builds that exist
    for current torch. The bodies are unchanged (they only touch the actor's own dicts). Spawned under
    the store's name before `initialize`, torchstore uses it. A module-level class (not one built at run
    time) so that a pickled reference names it instead of carrying its code.
    """

    get_controller_strategy = _async_endpoint("get_controller_strategy")
    locate_volumes = _async_endpoint("locate_volumes")
    notify_put = _async_endpoint("notify_put")
    keys = _async_endpoint("keys")
    notify_delete = _async_endpoint("notify_delete")


_BOUND: tuple[str, int] | None = None


def bind_listener(addr: str, port: int) -> None:
    """Bind this process's Monarch listener to tcp://addr:port (port 0: a free one), before its first
    Monarch call; once per process (a second store or loader here reuses it)."""
    global _BOUND
    if _BOUND is not None:
        if _BOUND[0] != addr or (port and _BOUND[1] != port):
            raise ConfigError(
                f"this process's Monarch listener is bound to {_BOUND[0]}:{_BOUND[1] or 'a free port'} already; "
                f"weights.torchstore_addr/torchstore_port ({addr}:{port}) must be the same for every store in one process"
            )
        return
    # Monarch's log filter (on every handler, once a Monarch context exists) rewrites record.msg with an
    # "[actor=...]" prefix; structlog's events are dicts there, so every log line after it was lost
    # ("'str' object has no attribute 'copy'"). Its private switch turns the rewrite off.
    actor_config.prefix_python_logs_with_actor = False
    host = f"[{addr}]" if ":" in addr else addr
    enable_transport(f"tcp://{host}:{port}")
    _BOUND = (addr, port)


_ALLOWED_MODULES = ("monarch.", "monarch._rust_bindings.", "torchstore.")
_ALLOWED_NAMES = {
    ("builtins", "getattr"),  # Monarch rebuilds a mesh's attributes through getattr
    ("builtins", "str"),
    ("builtins", "int"),
    ("builtins", "dict"),
    ("builtins", "list"),
    ("builtins", "tuple"),
    ("_operator", "getitem"),
    ("typing", "List"),
    ("typing", "Dict"),
    ("typing", "Optional"),
    ("typing", "Any"),
    (__name__, "AsyncController"),
}


class _RefUnpickler(pickle.Unpickler):
    """Rebuilds only Monarch and torchstore objects: a value in the broker that names anything else is
    refused. This narrows, but does not remove, what a broker writer can make a reader run (see
    docs/multihost.md, "TorchStore between processes")."""

    def find_class(self, module: str, name: str):
        if module.startswith(_ALLOWED_MODULES) or (module, name) in _ALLOWED_NAMES:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"the torchstore controller reference names {module}.{name}, which is not allowed")


def dumps_ref(controller) -> bytes:
    return pickle.dumps(controller)


def loads_ref(data: bytes):
    return _RefUnpickler(io.BytesIO(data)).load()


async def announce(broker: Broker, keys: Keys, controller, addr: str, port: int) -> None:
    """Publisher: put the controller's reference (and where it listens, for error messages) in the broker."""
    where = f"{addr}:{port or 'a free port'}"
    await broker.hset(keys.weights_torchstore, {"ref": dumps_ref(controller), "addr": where})


class StoreReader:
    """Reader: a torchstore client on the controller the broker names, rebuilt when the publisher
    (and so the reference) changes, e.g. after a trainer restart."""

    def __init__(self, broker: Broker, keys: Keys):
        self.broker, self.keys = broker, keys
        self._ref: bytes | None = None
        self._client: LocalClient | None = None

    async def client(self) -> LocalClient:
        raw = await self.broker.hgetall(self.keys.weights_torchstore)
        ref = raw.get("ref") or raw.get(b"ref")
        if not ref:
            raise WeightStoreError(
                f"no torchstore controller reference in the broker ({self.keys.weights_torchstore}): the trainer "
                "has not started its store yet; every role needs weights.backend=torchstore"
            )
        if ref != self._ref:
            addr = raw.get("addr") or raw.get(b"addr") or b"?"
            addr = addr.decode() if isinstance(addr, bytes) else addr
            controller = loads_ref(ref)
            try:
                strategy = await asyncio.wait_for(controller.get_controller_strategy.call_one(), CONNECT_TIMEOUT_S)
            except TimeoutError:
                raise WeightStoreError(
                    f"the torchstore controller at {addr} did not answer in {CONNECT_TIMEOUT_S:.0f} s: check that this "
                    "host routes to the trainer's weights.torchstore_addr and the trainer routes back to this "
                    "process's weights.torchstore_addr (set it to this host's address on that network)"
                ) from None
            self._client, self._ref = LocalClient(controller=controller, strategy=strategy), ref
        return self._client
