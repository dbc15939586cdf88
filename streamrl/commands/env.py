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

from streamrl.commands.common import add_attach_args, add_section_flag, given
from streamrl.config.schema import BrokerConfig, Config, EnvConfig, RunConfig

NAME = "env"
HELP = "attach an environment class (multi-turn episodes) to a running job"
DESCRIPTION = (
    "Read env_steps with the consumer group 'env', run each step with --fn and write the observation "
    "(docs/protocol.md, 'Environment steps')."
)


def add_arguments(p) -> None:
    add_attach_args(
        p,
        "package.module:Class",
        "env class (streamrl.envs.base.Env), or an adapter: textarena:<game> (docs/environments.md)",
    )
    add_section_flag(p, "--concurrency", EnvConfig, "concurrency", "steps in flight at once")
    add_section_flag(p, "--step-timeout", EnvConfig, "step_timeout_s", "seconds an env call may take")
    add_section_flag(
        p,
        "--claim-idle-ms",
        BrokerConfig,
        "claim_idle_ms",
        "take over a dead worker's steps after they are idle this long",
    )
    p.add_argument("--id", help="worker id (default: env-HOST-PID)")


def job_config(args) -> Config:
    """The sections this command knows of the job (run, broker, env), from its flags; every field no
    flag sets is its section's default. The worker (and an env class's `from_config(cfg)`, e.g. the
    tool envs') take a whole Config, so the sections it has no flags for are their defaults."""
    return Config(
        run=RunConfig(name=args.run),
        broker=BrokerConfig(**given(args, "claim_idle_ms")),
        env=EnvConfig(fn=args.fn, **given(args, "concurrency", "step_timeout_s")),
    )


def run(args) -> int:
    import sys

    from streamrl.commands.common import broker_url
    from streamrl.core.logs import setup_logging
    from streamrl.envs.resolve import resolve_env
    from streamrl.launch.runtime import serve
    from workers.env import EnvWorker

    sys.path.insert(0, os.getcwd())  # like `python -m`: modules next to where the user runs the command
    factory = resolve_env(args.fn)
    cfg = job_config(args)
    url = broker_url(args)
    wid = args.id or f"env-{os.uname().nodename}-{os.getpid()}"
    run_dir = Path(args.run_dir) if args.run_dir else None
    setup_logging("env", wid, run_dir, run=args.run)
    serve(lambda broker: EnvWorker(cfg, broker, wid, run_dir, factory=factory), url)
    return 0
