"""Composition root for one role process: logging, broker connection, signals, the worker loop.

    streamrl worker reward --config run/config.yaml --broker redis://:pw@host:6379/0 --run tiny

Roles are imported lazily by name (workers.<role>), so `streamrl` never imports `workers` at
module level. A role is a Worker class, which this module serves, or a `main(cfg, worker_id,
run_dir, serve)` that starts its own processes and hands `serve` (bound to the job's broker) the
factory of the Worker it runs (the trainer: its ranks, rank 0 serving TrainerWorker), so no role
imports the launcher. SIGINT/SIGTERM ask the worker to finish its current step and exit; a second
signal exits at once.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import signal
import sys
from functools import partial
from pathlib import Path
from typing import Callable

from streamrl.config.schema import Config
from streamrl.core.errors import EXIT_NO_RESTART, NOT_TRANSIENT, ConfigError, FatalError
from streamrl.core.logs import setup_logging
from streamrl.core.stacks import task_stacks

STOPPING_NOTICE_S = 1.0
"""A stop still running after this long is announced (`stopping`), so a slow drain is visible."""
ROLES: dict[str, str] = {
    "feeder": "workers.feeder:FeederWorker",
    "generator": "workers.generator:GeneratorWorker",
    "reward": "workers.reward:RewardWorker",
    "reference": "workers.reference:ReferenceWorker",
    "judge": "workers.judge:JudgeWorker",
    "env": "workers.env:EnvWorker",
    "trainer": "workers.trainer:main",
}


def _load(role: str):
    if role not in ROLES:
        raise ConfigError(f"unknown role {role!r}; choose one of: {', '.join(ROLES)}")
    module, name = ROLES[role].split(":")
    return getattr(importlib.import_module(module), name)


async def _serve(factory: Callable, broker_url: str, retries: int, wait: tuple[int, int]) -> None:
    from brokers.connect import connect
    from brokers.replica_wait import ReplicaWait

    broker = await connect(broker_url, retries=retries, durable=ReplicaWait(*wait))
    worker = factory(broker)
    loop = asyncio.get_running_loop()
    hits = {"n": 0}

    def on_signal(signum: int) -> None:
        hits["n"] += 1
        if hits["n"] > 1:
            # What the stop was waiting on, so a slow shutdown can be diagnosed from the log.
            worker.log.warning("forced_exit", signal=signal.Signals(signum).name, tasks=task_stacks())
            kill_children()  # e.g. vLLM's EngineCore: orphaned, it would keep its memory and cores
            os._exit(130)
        worker.stop(reason=signal.Signals(signum).name)
        # A quick stop is one line (`stopped reason=SIGTERM`); a slower one says it is draining.
        loop.call_later(STOPPING_NOTICE_S, lambda: worker.log.info("stopping", signal=signal.Signals(signum).name))
        loop.call_later(
            worker.stop_budget_s(),
            lambda: worker.log.warning("stop_slow", budget_s=worker.stop_budget_s(), tasks=task_stacks()),
        )

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await worker.run()
    finally:
        await broker.close()


def kill_children() -> None:
    """SIGKILL every process this one started (recursively), before an exit that skips cleanup."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:
            pass


def serve(factory: Callable, broker_url: str, retries: int = 20, wait: tuple[int, int] = (0, 1000)) -> None:
    """Run one Worker (built by `factory(broker)`) until it finishes or is signalled;
    `retries` = broker.connect_retries (connection attempts, with back-off, before giving up);
    `wait` = (broker.wait_replicas, broker.wait_timeout_ms) (brokers/replica_wait.py)."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(_serve(factory, broker_url, retries, wait))
    else:
        uvloop.run(_serve(factory, broker_url, retries, wait))


def run_role(role: str, cfg: Config, broker_url: str, worker_id: str, run_dir: Path | None) -> int:
    """Run one role to its end: 0, or EXIT_NO_RESTART after a FatalError (its message on stderr)."""
    from streamrl.core.worker import startup_failure

    try:
        try:
            target = _load(role)
        except NOT_TRANSIENT as exc:  # e.g. a package the role's module needs is not installed
            raise startup_failure(role, exc) from exc
        setup_logging(role, worker_id, run_dir, run=cfg.run.name)
        # picklable (a module-level function, bound by partial): the trainer hands it to a spawned rank 0
        serve_here = partial(
            serve,
            broker_url=broker_url,
            retries=cfg.broker.connect_retries,
            wait=(cfg.broker.wait_replicas, cfg.broker.wait_timeout_ms),
        )
        if isinstance(target, type):
            serve_here(lambda broker: target(cfg, broker, worker_id, run_dir))
        else:
            target(cfg, worker_id, run_dir, serve_here)
    except FatalError as exc:
        print_fatal(exc)
        return EXIT_NO_RESTART
    return 0


FATAL_PREFIX = "fatal error (not restarted): "
"""How a role process prints a FatalError last on stderr; the supervisor quotes that line."""


def print_fatal(exc: BaseException) -> None:
    print(FATAL_PREFIX + " ".join(str(exc).split("\n")), file=sys.stderr, flush=True)


if __name__ == "__main__":  # pragma: no cover - `python -m streamrl.launch.runtime` is not an entry point
    sys.exit("use `streamrl worker ROLE ...`")
