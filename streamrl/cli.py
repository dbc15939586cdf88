"""The `streamrl` command line.

    streamrl up                                   # the tiny CPU job on an embedded broker
    streamrl up --config configs/X.yaml --set trainer.steps=20 --run-dir runs/demo
    streamrl worker generator --broker redis://:pw@host:6379/0 --run tiny --config X.yaml
    streamrl config --config X.yaml --set loss.name=gspo      # validate and print the resolved config
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from streamrl.config import Config, load_config
from streamrl.errors import ConfigError, StreamRLError

EPILOG = """Every role can also run alone: `streamrl worker ROLE` joins a running job through its broker
URL (from --broker, $STREAMRL_BROKER_URL, or RUN_DIR/broker/url). See README.md."""


def _cache_dir() -> Path:
    return Path(os.environ.get("STREAMRL_CACHE", Path.home() / ".cache" / "streamrl"))


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config (default: configs/tiny-cpu.yaml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override one config value, e.g. --set trainer.steps=20 (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamrl", description="Asynchronous streaming RL post-training "
                                     "of LLMs: every role is a process connected through Redis Streams.",
                                     epilog=EPILOG)
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run a whole job on this machine (broker + every role)",
                        description="Start the broker (if broker.url is 'embedded') and every role with its "
                        "configured count, print progress, and stop everything when training ends.")
    _add_config_args(up)
    up.add_argument("--run-dir", help="output folder (default: a new folder under runs/)")

    worker = sub.add_parser("worker", help="run one role process against a broker (multi-host, elastic)",
                            description="Run one role. Joins a running job: the same command on any host that "
                            "reaches the broker adds a worker.")
    worker.add_argument("role", choices=["feeder", "generator", "reward", "reference", "trainer"])
    _add_config_args(worker)
    worker.add_argument("--broker", help="redis:// URL (default: $STREAMRL_BROKER_URL or RUN_DIR/broker/url)")
    worker.add_argument("--run", help="run name (overrides run.name)")
    worker.add_argument("--run-dir", help="folder for this worker's logs (and the trainer's metrics)")
    worker.add_argument("--id", help="worker id, unique within its role (default: ROLE-HOST-PID)")

    cfg = sub.add_parser("config", help="validate a config and print it fully resolved")
    _add_config_args(cfg)
    return parser


def _load(args) -> Config:
    overrides = list(args.overrides)
    if getattr(args, "run", None):
        overrides.append(f"run.name={args.run}")
    return load_config(args.config, overrides)


def _resolve_model(cfg: Config) -> Config:
    from streamrl.tiny import resolve_model_path

    path = resolve_model_path(cfg.model, _cache_dir() / "models", cfg.run.seed)
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": str(path)})})


def cmd_up(args) -> int:
    from streamrl.supervisor import Supervisor

    cfg = _load(args)
    run_dir = Path(args.run_dir or Path("runs") / f"{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    print(f"streamrl up: run '{cfg.run.name}' in {run_dir}", flush=True)
    cfg = _resolve_model(cfg)
    embedded = None
    url = cfg.broker.url
    if url == "embedded":
        from brokers.embedded import EmbeddedRedis

        embedded = EmbeddedRedis(run_dir / "broker", binary=cfg.broker.redis_server)
        embedded.start()
        url = embedded.url
        print(f"embedded broker on 127.0.0.1:{embedded.port} (password in {run_dir / 'broker' / 'url'})", flush=True)
    try:
        code = Supervisor(cfg, run_dir, url, say=lambda m: print(m, flush=True)).run()
    finally:
        if embedded is not None:
            embedded.stop()
        if cfg.weights.backend == "shm":
            import shutil

            from streamrl.weightstores.shm import shm_root

            shutil.rmtree(shm_root(cfg.run.name), ignore_errors=True)
    if code == 0:
        print(f"done: metrics in {run_dir / 'metrics.jsonl'}", flush=True)
    return code


def _broker_url(args) -> str:
    if args.broker:
        return args.broker
    if os.environ.get("STREAMRL_BROKER_URL"):
        return os.environ["STREAMRL_BROKER_URL"]
    if args.run_dir and (Path(args.run_dir) / "broker" / "url").exists():
        return (Path(args.run_dir) / "broker" / "url").read_text().strip()
    raise ConfigError("no broker URL: pass --broker redis://HOST:6379/0, set STREAMRL_BROKER_URL, "
                      "or --run-dir of a running `streamrl up`")


def cmd_worker(args) -> int:
    from streamrl.runtime import run_role

    cfg = _load(args)
    url = _broker_url(args)
    if cfg.model.path is None:
        cfg = _resolve_model(cfg)
    wid = args.id or f"{args.role}-{os.uname().nodename}-{os.getpid()}"
    return run_role(args.role, cfg, url, wid, Path(args.run_dir) if args.run_dir else None)


def cmd_config(args) -> int:
    import yaml

    print(yaml.safe_dump(_load(args).model_dump(mode="json"), sort_keys=False), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {"up": cmd_up, "worker": cmd_worker, "config": cmd_config}[args.command](args)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    except StreamRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
