"""`streamrl env`: attach an environment (a Python class) to a running job's multi-turn episodes.

    streamrl env --fn my_envs:Calculator --run tiny --broker redis://:PW@host:6379/0 [--concurrency 32]
    streamrl env --fn my_envs:Calculator --run tiny --config job.yaml      # the job's tools/env sections

The class subclasses streamrl.envs.base.Env (`reset(item)`, `step(action) -> (observation, reward,
done)`, sync or async). Run the command several times (any host) for more throughput: every
replica reads `env_steps` with the consumer group "env" and they share the steps. The job's own
config decides the rest (env.max_turns on the generators); `streamrl worker env` is the same
worker with env.fn taken from the config. The sections the flags do not set (tools for a tool env,
env.max_turns, ...) come from --config: the job's YAML, or RUN_DIR/config.yaml, which --run-dir
finds by itself; without either they are their sections' defaults.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from streamrl.commands.common import add_attach_args, add_section_flag, given
from streamrl.config.files import load_config
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
    p.add_argument(
        "--config",
        help="the job's config (its YAML, or RUN_DIR/config.yaml) for the sections no flag sets, e.g. tools "
        "for a tool env (default: RUN_DIR/config.yaml with --run-dir, else every section's default)",
    )


def job_file(args) -> Path | None:
    """--config, else RUN_DIR/config.yaml of --run-dir when the job wrote one, else None."""
    if args.config:
        return Path(args.config)
    if args.run_dir and (Path(args.run_dir) / "config.yaml").is_file():
        return Path(args.run_dir) / "config.yaml"
    return None


def job_config(args) -> Config:
    """The job's config as this worker needs it: run.name, env.fn and what the flags set, over the
    job's own file (job_file) where there is one, over the sections' defaults where there is none. The
    worker (and an env class's `from_config(cfg)`, e.g. the tool envs') read the whole Config."""
    path = job_file(args)
    if path is None:
        return Config(
            run=RunConfig(name=args.run),
            broker=BrokerConfig(**given(args, "claim_idle_ms")),
            env=EnvConfig(fn=args.fn, **given(args, "concurrency", "step_timeout_s")),
        )
    flags = {"run.name": args.run, "env.fn": args.fn}
    flags |= {f"env.{k}": v for k, v in given(args, "concurrency", "step_timeout_s").items()}
    flags |= {f"broker.{k}": v for k, v in given(args, "claim_idle_ms").items()}
    # Through load_config's override path (validated, errors naming the field) with JSON values: a
    # string --fn such as `textarena:Wordle-v0` stays a string.
    return load_config(path, [f"{k}={json.dumps(v)}" for k, v in flags.items()])


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
