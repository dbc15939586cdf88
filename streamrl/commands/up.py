"""`streamrl up`: the whole job on this machine (broker + every role), progress on the console."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from streamrl.commands.common import add_config_args, load, resolve_model
from streamrl.errors import ConfigError

NAME = "up"
HELP = "run a whole job on this machine (broker + every role)"
DESCRIPTION = ("Start the broker (if broker.url is 'embedded') and every role with its configured count, "
               "print progress, and stop everything when training ends.")


def add_arguments(p) -> None:
    add_config_args(p)
    p.add_argument("--run-dir", help="output folder (default: a new folder under runs/)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR: its config (plus --set), "
                   "its broker (embedded: the same data dir and append-only file), its newest checkpoint")


def run(args) -> int:
    from streamrl.supervisor import Supervisor

    if args.resume:
        if not (Path(args.resume) / "config.yaml").is_file():
            raise ConfigError(f"--resume {args.resume}: no config.yaml there; pass the run directory of an earlier `streamrl up`")
        args.config, args.run_dir = args.config or str(Path(args.resume) / "config.yaml"), args.resume
    cfg = load(args)
    run_dir = Path(args.run_dir or Path("runs") / f"{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    print(f"streamrl up: run '{cfg.run.name}' in {run_dir}", flush=True)
    cfg = resolve_model(cfg)
    embedded = None
    url = cfg.broker.url
    if url == "embedded":
        from brokers.embedded import EmbeddedRedis

        embedded = EmbeddedRedis(run_dir / "broker", binary=cfg.broker.redis_server)
        embedded.start()
        url = embedded.url
        print(f"embedded broker on 127.0.0.1:{embedded.port} (password in {run_dir / 'broker' / 'url'})", flush=True)
    sup = Supervisor(cfg, run_dir, url, say=lambda m: print(m, flush=True), broker_server=embedded)
    code = 1
    try:
        code = sup.run()
    finally:
        from streamrl.run_end import end_run

        # Producers of the run see it end (and leave) before an embedded broker goes away under them.
        end_run(url, cfg.run.name, "streamrl up exited" + ("" if code == 0 else f" with code {code}"))
        if embedded is not None:
            sup.broker_watch.server.stop()  # the one running now (restarted if the first died)
        if cfg.weights.backend == "shm":
            from streamrl.weightstores.shm import shm_root

            shutil.rmtree(shm_root(cfg.run.name), ignore_errors=True)
    if code == 0:
        print(f"done: metrics in {run_dir / 'metrics.jsonl'}", flush=True)
    return code
