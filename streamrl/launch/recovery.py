"""What `streamrl up` does when a process dies: the restart policy (pure), how the process ended
(describe_exit) and the embedded broker watch.

    policy = RestartPolicy(cfg.supervisor)
    policy.allows("generator", restarts=2)  # -> True while restart is on and under max_restarts
    policy.delay(restarts=2)                # -> backoff_s * 2**2, capped at backoff_max_s

A restarted worker keeps its worker id, so it reads its own un-acked entries first; the other
workers of its role take them over through XAUTOCLAIM after broker.claim_idle_ms if it is slower.
The trainer restarts only with supervisor.restart_trainer (it resumes from its newest checkpoint).
A process that exits with EXIT_NO_RESTART (78: a broken config or environment found at start-up, a
job where nothing can be trained) is never restarted: the job stops at once with its error.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from streamrl.config.schema import SupervisorConfig
from streamrl.core.errors import EXIT_NO_RESTART


class RestartPolicy:
    def __init__(self, cfg: SupervisorConfig):
        self.cfg = cfg

    def allows(self, role: str, restarts: int, code: int | None = None) -> bool:
        """Whether a process of `role` that died with exit `code` after `restarts` restarts is restarted."""
        if code == EXIT_NO_RESTART:
            return False
        enabled = self.cfg.restart_trainer if role == "trainer" else self.cfg.restart
        return enabled and restarts < self.cfg.max_restarts

    def delay(self, restarts: int) -> float:
        return min(self.cfg.backoff_s * (2**restarts), self.cfg.backoff_max_s)

    def refusal(self, role: str, restarts: int, code: int | None = None) -> str:
        """Why a death ends the run, and the setting that changes it."""
        if code == EXIT_NO_RESTART:
            return "it stopped on an error a restart would not fix, so the job stops (fix it and run again)"
        if role == "trainer" and not self.cfg.restart_trainer:
            return "the trainer is not restarted (set supervisor.restart_trainer=true to resume it from its checkpoint)"
        if not self.cfg.restart:
            return "restarts are off (supervisor.restart=false)"
        return f"it already restarted {restarts} times (supervisor.max_restarts={self.cfg.max_restarts})"


def describe_exit(code: int, oom: str = "") -> str:
    """How a process ended; `oom`: the OOM killer's evidence (OomWatch.evidence), "" when there is none."""
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    return f"{how} — {oom}" if oom else how


class BrokerWatch:
    """Restart the embedded redis-server if it dies: same port, password and append-only file."""

    def __init__(self, server, enabled: bool, say=print):
        self.server = server
        """brokers.embedded.EmbeddedRedis (None for an external broker: nothing to watch)."""
        self.enabled = enabled
        self.say = say
        self.restarts = 0

    def check(self) -> None:
        from brokers.embedded import EmbeddedRedis
        from streamrl.core.errors import BrokerError

        proc = getattr(self.server, "proc", None)
        if proc is None or proc.poll() is None:
            return
        how = describe_exit(proc.returncode)
        if not self.enabled:
            raise BrokerError(
                f"the embedded redis-server {how}; set supervisor.restart_broker=true to restart "
                f"it automatically (see {Path(self.server.data_dir) / 'redis.log'})"
            )
        self.restarts += 1
        self.say(f"broker (redis-server) {how}; restarting it on port {self.server.port} from its append-only file")
        t0 = time.time()
        # A fixed port (and the same socket path): every worker reconnects to the URL it already has
        # (redis-py retries with back-off).
        fresh = EmbeddedRedis(
            self.server.data_dir,
            binary=self.server.binary,
            port=self.server.port,
            password=self.server.password,
            unix_socket=self.server.unix_socket,
        )
        fresh.start(timeout=60)
        self.server = fresh
        self.say(f"broker back after {time.time() - t0:.1f}s")
