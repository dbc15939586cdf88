"""How every process of a run, external producers included, learns that the run is over.

The key `streamrl:{run}:run:end` (a string: JSON `{"reason", "version", "ts"}`) is set when the
run ends: by the trainer when it has trained its steps, and by `streamrl up` when it exits for any
reason (it never overwrites the trainer's). A trainer that starts deletes it (a resumed run runs
again). A producer's broker user may GET it and nothing more (`streamrl producer add`), so on
Redis 6.2, where its granted XADD works on every granted key, the mark still cannot be forged:
XADD cannot overwrite a string, and a stream someone created there reads as "not ended".
docs/protocol.md ("Run end") is the contract for producers in other languages.

    await mark_ended(broker, keys, "trainer finished", version=60)
    info = await ended(broker, keys)      # None while the run runs
"""

from __future__ import annotations

import json
import time

from redis.exceptions import ResponseError

from streamrl.core.broker import Broker, Keys

POLL_S = 1.0
"""How often a producer checks the mark (one GET)."""
PRODUCERS_LEAVE_S = 5.0
"""How long `streamrl up` waits, after marking the end, for connected producers to leave before it
stops an embedded broker (they see the mark within POLL_S and drain their batches)."""


def _payload(reason: str, version: int) -> str:
    return json.dumps({"reason": reason, "version": version, "ts": time.time()})


async def mark_ended(broker: Broker, keys: Keys, reason: str, version: int = -1) -> None:
    await broker.set(keys.run_end, _payload(reason, version))


async def clear_ended(broker: Broker, keys: Keys) -> None:
    await broker.delete(keys.run_end)


def parse(raw: bytes | str | None) -> dict | None:
    if raw is None:
        return None
    try:
        info = json.loads(raw)
    except ValueError:
        return {"reason": str(raw)[:200], "version": -1}
    return info if isinstance(info, dict) else {"reason": str(info)[:200], "version": -1}


async def ended(broker: Broker, keys: Keys) -> dict | None:
    """The end mark ({"reason", "version", "ts"}), or None while the run runs."""
    try:
        return parse(await broker.get(keys.run_end))
    except ResponseError as exc:  # WRONGTYPE: a stream was XADDed there (see the module doc)
        if "WRONGTYPE" in str(exc):
            return None
        raise


def describe(run: str, info: dict) -> str:
    version = info.get("version", -1)
    return f"run {run} ended: {info.get('reason', '?')}" + (f" (version {version})" if version >= 0 else "")


def user_name(run: str, name: str) -> str:
    """The broker user of producer `name` in `run` (`streamrl producer` creates it; the run's end waits for
    its connections to leave)."""
    return f"producer-{run}-{name}"


def end_run(url: str, run: str, reason: str, wait_s: float = PRODUCERS_LEAVE_S) -> None:
    """`streamrl up`'s exit: set the mark unless the trainer did, then give connected producers of
    the run up to `wait_s` to see it and disconnect. A broker that cannot be reached is skipped."""
    import redis

    from streamrl.core.broker_url import is_cluster_url, sync_client

    keys = Keys(run, cluster=is_cluster_url(url))
    try:
        with sync_client(url, socket_timeout=2, socket_connect_timeout=2) as r:
            r.set(keys.run_end, _payload(reason, -1), nx=True)
            if keys.cluster:  # CLIENT LIST is per node there; the producers see the mark at their next poll
                return
            prefix = user_name(run, "")
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and any(c.get("user", "").startswith(prefix) for c in r.client_list()):
                time.sleep(0.2)
    except redis.RedisError:
        pass  # the broker is gone: nobody is left to tell
