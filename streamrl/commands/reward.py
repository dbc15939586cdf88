"""`streamrl reward`: attach an external reward producer (a Python function) to a running job.

    streamrl reward --fn my_judge:judge --run tiny --broker redis://judge:PW@host:6379/0 [--key judge --name judge]

The function takes a list of decoded `Rollout`s and returns one score per rollout (sync or
async; see streamrl/annotate/sdk.py). List its key in the trainer's `annotations.external` so the
assembler waits for it. Run the command several times (any host) for more throughput: replicas
with the same --name share the work.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Callable

from streamrl.commands.common import add_attach_args, add_section_flag, given
from streamrl.config.schema import BrokerConfig
from streamrl.core.errors import ConfigError
from streamrl.core.imports import import_spec

if TYPE_CHECKING:
    from streamrl.annotate.sdk import ProducerSpec, ProducerWorker
    from streamrl.core.broker import Broker

NAME = "reward"
HELP = "attach an external reward producer (a Python function) to a running job"
DESCRIPTION = (
    "Read rollouts with the producer's own consumer group, score them in batches with --fn, and "
    "write annotations under --key (docs/protocol.md)."
)


def add_arguments(p) -> None:
    add_attach_args(
        p,
        "package.module:function",
        "scoring function: list[Rollout] -> list[float] (may be decorated with @streamrl.annotate.sdk.producer)",
    )
    p.add_argument("--key", help="annotation key (default: the decorator's, required without one)")
    p.add_argument("--name", help="producer name = consumer group (default: the key)")
    p.add_argument("--batch-size", type=int, help="rollouts per call (default 16)")
    p.add_argument("--concurrency", type=int, help="calls in flight (default 4)")
    p.add_argument("--timeout", type=float, dest="timeout_s", help="seconds per call before its batch fails")
    add_section_flag(
        p,
        "--claim-idle-ms",
        BrokerConfig,
        "claim_idle_ms",
        "take over a dead replica's entries after they are idle this long",
    )
    add_section_flag(
        p,
        "--connect-retries",
        BrokerConfig,
        "connect_retries",
        "attempts (with back-off up to 2 s) to reach the broker, at start and per command, before "
        "the producer gives up and exits (about 2 s each)",
    )
    p.add_argument(
        "--partitions",
        type=int,
        default=1,
        help="the job's rollout.partitions (default 1): the producer reads every partition",
    )
    p.add_argument("--id", help="replica id (default: NAME-HOST-PID)")


def load_function(spec: str):
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"--fn {spec!r} must be package.module:function, e.g. --fn my_judge:judge")
    sys.path.insert(0, os.getcwd())  # like `python -m`: modules next to where the user runs the command
    module_name, attr, fn = import_spec(spec, f"--fn {spec!r}", "install it or add its folder to PYTHONPATH")
    if not callable(fn):
        raise ConfigError(
            f"--fn {spec!r}: {module_name!r} has no function {attr!r}; define "
            f"`def {attr}(rollouts: list[Rollout]) -> list[float]` there"
        )
    return fn


def run(args) -> int:
    from pathlib import Path

    from streamrl.annotate.sdk import spec_of
    from streamrl.commands.common import broker_url
    from streamrl.core.logs import setup_logging

    fn = load_function(args.fn)
    spec = spec_of(
        fn,
        key=args.key,
        name=args.name,
        batch_size=args.batch_size,
        concurrency=args.concurrency,
        timeout_s=args.timeout_s,
    )
    url = broker_url(args)
    wid = args.id or f"{spec.name}-{os.uname().nodename}-{os.getpid()}"
    setup_logging("producer", wid, Path(args.run_dir) if args.run_dir else None, run=args.run)
    return serve_producer(fn, spec, url, args.run, wid, broker_section(args), args.partitions)


def broker_section(args) -> BrokerConfig:
    """The broker section from the flags; a field no flag sets is the section's default."""
    return BrokerConfig(**given(args, "claim_idle_ms", "connect_retries"))


def serve_producer(
    fn: Callable,
    spec: ProducerSpec,
    broker_url: str,
    run: str,
    worker_id: str,
    broker_cfg: BrokerConfig | None = None,
    partitions: int = 1,
) -> int:
    """Run one producer replica until its run ends, its broker is lost, or SIGINT/SIGTERM (then drain
    in-flight batches and exit); return the exit code (ProducerWorker.exit_code). `broker_cfg`: the
    broker section (claim_idle_ms, connect_retries, ...); None: its defaults."""
    from streamrl.annotate.sdk import ProducerWorker
    from streamrl.launch.runtime import serve

    broker_cfg = broker_cfg or BrokerConfig()
    made: list[ProducerWorker] = []

    def build(broker: Broker) -> ProducerWorker:
        made.append(ProducerWorker(fn, spec, broker, run, worker_id, broker_cfg, partitions))
        return made[-1]

    serve(build, broker_url, broker_cfg.connect_retries)
    return made[-1].exit_code if made else 1
