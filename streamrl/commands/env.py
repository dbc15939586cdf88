"""`streamrl env`: attach an environment (a Python class) to a running job's multi-turn episodes.

    streamrl env --fn my_envs:Calculator --run tiny --broker redis://:PW@host:6379/0 [--concurrency 32]

The class subclasses streamrl.envs.base.Env (`reset(item)`, `step(action) -> (observation, reward,
done)`, sync or async). Run the command several times (any host) for more throughput: every
replica reads `env_steps` with the consumer group "env" and they share the steps. The job's own
config decides the rest (env.max_turns on the generators); `streamrl worker env` is the same
worker with env.fn taken from the config.
"""

from __future__ import annotations

import os
from pathlib import Path

NAME = "env"
HELP = "attach an environment class (multi-turn episodes) to a running job"
DESCRIPTION = (
    "Read env_steps with the consumer group 'env', run each step with --fn and write the observation "
    "(docs/protocol.md, 'Environment steps')."
)


def add_arguments(p) -> None:
    p.add_argument(
        "--fn",
        required=True,
        metavar="package.module:Class",
        help="env class (streamrl.envs.base.Env), or an adapter: textarena:<game> (docs/environments.md)",
    )
    p.add_argument("--run", required=True, help="run name (run.name of the job)")
    p.add_argument("--broker", help="redis:// URL (default: $STREAMRL_BROKER_URL or RUN_DIR/broker/url)")
    p.add_argument("--run-dir", help="run directory of a local `streamrl up` (for its broker URL and logs)")
    p.add_argument("--concurrency", type=int, default=32, help="steps in flight at once (default 32)")
    p.add_argument("--step-timeout", type=float, default=10.0, help="seconds an env call may take (default 10)")
    p.add_argument(
        "--claim-idle-ms",
        type=int,
        default=30_000,
        help="take over a dead worker's steps after they are idle this long",
    )
    p.add_argument("--id", help="worker id (default: env-HOST-PID)")


def run(args) -> int:
    import sys

    from streamrl.commands.common import broker_url
    from streamrl.config.schema import BrokerConfig, Config, EnvConfig, RunConfig
    from streamrl.core.logs import setup_logging
    from streamrl.envs.resolve import resolve_env
    from streamrl.launch.runtime import serve
    from workers.env import EnvWorker

    sys.path.insert(0, os.getcwd())  # like `python -m`: modules next to where the user runs the command
    factory = resolve_env(args.fn)
    cfg = Config(
        run=RunConfig(name=args.run),
        broker=BrokerConfig(claim_idle_ms=args.claim_idle_ms),
        env=EnvConfig(fn=args.fn, concurrency=args.concurrency, step_timeout_s=args.step_timeout),
    )
    url = broker_url(args)
    wid = args.id or f"env-{os.uname().nodename}-{os.getpid()}"
    run_dir = Path(args.run_dir) if args.run_dir else None
    setup_logging("env", wid, run_dir, run=args.run)
    serve(lambda broker: EnvWorker(cfg, broker, wid, run_dir, factory=factory), url)
    return 0
