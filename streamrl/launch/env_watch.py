"""The console of `streamrl up` for a job whose env workers are all external (env.fn: external):
`up` starts none, so until one joins every episode waits. This watch repeats a warning while no env
worker has a heartbeat, says when one joins, and warns again if every one leaves.

    watch = EnvWatch(broker_url, run="tiny", every_s=30)
    if line := watch.poll():   # from the supervisor's loop
        print(line)
"""

from __future__ import annotations

import time

from streamrl.core.broker import Keys


def env_line(workers: list[str], waiting: int | None, missing_before: bool, run: str) -> str | None:
    """The console line for what the broker shows now (None: nothing new to say); pure.
    `missing_before`: the last check found no env worker."""
    if workers:
        return f"env worker(s) joined: {', '.join(sorted(workers))}" if missing_before else None
    steps = "" if waiting is None else f"; {waiting} env step(s) waiting"
    return (
        f"warning: no env worker has joined yet (env.fn=external){steps}. Episodes wait until one does: "
        f"start one with `streamrl env --fn package.module:Class --run {run} --broker URL` or any env worker "
        'speaking docs/protocol.md ("Environment steps"); `streamrl envuser add` gives it a restricted URL'
    )


class EnvWatch:
    def __init__(self, broker_url: str, run: str, every_s: float = 30.0, check_s: float = 2.0):
        self.url, self.run, self.keys = broker_url, run, Keys(run)
        self.every_s, self.check_s = every_s, check_s
        """Repeat the warning every `every_s` while no env worker is there; look every `check_s`."""
        self._checked_at = 0.0
        self._said_at = time.monotonic()  # `up` has just said it once, at start
        self._missing = True
        self._client = None

    def _look(self) -> tuple[list[str], int | None]:
        import redis

        if self._client is None:
            self._client = redis.Redis.from_url(self.url, socket_timeout=2.0, socket_connect_timeout=2.0)
        prefix = self.keys.worker("env", "")
        workers = [k.decode()[len(prefix) :] for k in self._client.scan_iter(match=prefix + "*", count=1000)]
        waiting = None
        try:  # the generators create the group with their first step
            group = next(g for g in self._client.xinfo_groups(self.keys.env_steps) if g["name"] == b"env")
            waiting = (group.get("pending") or 0) + (group.get("lag") or 0)
        except Exception:
            pass
        return workers, waiting

    def poll(self, now: float | None = None) -> str | None:
        now = time.monotonic() if now is None else now
        if now - self._checked_at < self.check_s:
            return None
        self._checked_at = now
        try:
            workers, waiting = self._look()
        except Exception:  # the broker restarting or gone: BrokerWatch says so
            self._client = None
            return None
        line = env_line(workers, waiting, self._missing, self.run)
        if not workers and not self._missing:
            self._said_at = now - self.every_s  # every worker left: say so now
        self._missing = not workers
        if workers:
            return line
        if now - self._said_at < self.every_s:
            return None
        self._said_at = now
        return line

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


class NoEnvWatch:
    """A job that starts its own env workers (or has none): nothing to watch."""

    def poll(self, now: float | None = None) -> None:
        return None

    def close(self) -> None:
        pass
