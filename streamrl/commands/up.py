"""`streamrl up`: the whole job on this machine (broker + every role), progress on the console."""

from __future__ import annotations

import os
import shutil
import signal
import threading
from pathlib import Path

from streamrl.commands.common import add_preflight_arg, preflight, quiet_progress_bars
from streamrl.config.args import add_config_args, load
from streamrl.core.errors import ConfigError
from streamrl.launch.rundir import claim, earlier_run, new_run_dir
from streamrl.models.chat_template import prompt_format
from streamrl.models.tiny import resolve_model
from streamrl.train.sink_paths import sink_lines

NAME = "up"
HELP = "run a whole job on this machine (broker + every role)"
DESCRIPTION = (
    "Start the broker (if broker.url is 'embedded') and every role with its configured count, "
    "print progress, and stop everything when training ends."
)


def add_arguments(p) -> None:
    add_config_args(p)
    add_preflight_arg(p)
    p.add_argument("--run-dir", help="output folder (default: a new folder under runs/)")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="the full step line (samples, tokens, trainer wait/train time, MFU, generator rate and busy share) "
        "on the console; RUN_DIR/logs/steps.log has it either way",
    )
    p.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR: its config (plus --set), "
        "its broker (embedded: the same data dir and append-only file), its newest checkpoint",
    )


def run(args) -> int:
    quiet_progress_bars()
    from streamrl.launch.supervisor import Supervisor

    if args.resume:
        if not (Path(args.resume) / "config.yaml").is_file():
            raise ConfigError(
                f"--resume {args.resume}: no config.yaml there; pass the run directory of an earlier `streamrl up`"
            )
        written = Path(args.resume) / "config.yaml"
        args.config, args.run_dir = args.config or str(written), args.resume
    cfg = load(args)
    if args.resume and Path(args.config) == written:
        from streamrl.losses.resume import switch_objective

        cfg, note = switch_objective(written, cfg, args.overrides)
        if note:
            print(note, flush=True)
    preflight(args, cfg)
    cfg = resolve_model(cfg)
    # Only now: a config error above leaves no empty run directory behind.
    if args.run_dir:
        run_dir = Path(args.run_dir).resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
    else:
        run_dir = new_run_dir(Path("runs"), cfg.run.name)
    lock = claim(run_dir)  # held until this process ends
    if not args.resume and (used := earlier_run(run_dir)):
        lock.close()
        raise ConfigError(
            f"--run-dir {run_dir} already holds a run ({used}); continue it with "
            f"`streamrl up --resume {run_dir}`, or pass another --run-dir (or none: a new "
            "folder under runs/)"
        )
    print(f"streamrl up: run '{cfg.run.name}' in {run_dir}", flush=True)
    print(prompt_format(cfg), flush=True)
    if warning := cfg.broker.inline_password_warning():
        print(warning, flush=True)
    embedded = sup = None
    url, code = cfg.broker.connect_url(), 1
    export = Export(run_dir, enabled=cfg.run.export)
    try:
        if url == "embedded":
            from brokers.embedded import EmbeddedRedis

            embedded = EmbeddedRedis(
                run_dir / "broker", binary=cfg.broker.redis_server, unix_socket=cfg.broker.unix_socket
            )
            embedded.start()
            url = embedded.local_url  # the roles run on this host; `streamrl worker` elsewhere reads broker/url
            via = f", roles via {embedded.socket_path}" if url != embedded.url else ""
            print(
                f"embedded broker on 127.0.0.1:{embedded.port}{via} (password in {run_dir / 'broker' / 'url'})",
                flush=True,
            )
        sup = Supervisor(
            cfg,
            run_dir,
            url,
            say=lambda m: print(m, flush=True),
            broker_server=embedded,
            resumed_at=resume_at(run_dir) if args.resume else None,
            on_first_step=export.warm,
            on_trained=export.start,
            started_at=command_started_at(),
            verbose=getattr(args, "verbose", False),
        )
        code = sup.run()
    finally:
        # Producers of the run see it end (and leave) before the broker goes away under them; the
        # broker goes last, after every role drained and the accounting read it.
        _end_run_and_stop_broker(url, cfg.run.name, code, sup.broker_watch.server if sup is not None else embedded)
        from streamrl.weights.shm import shm_root

        # This run's host-local weights and copies (shm, dir and torchstore backends); keyed by the
        # run dir, so another job of the same run.name keeps its own.
        shutil.rmtree(shm_root(cfg.run.name, run_dir), ignore_errors=True)
        if code != 0:
            export.discard()
    for line in sink_lines(cfg, run_dir):  # where W&B / TensorBoard wrote, and how to look
        print(line, flush=True)
    if code == 0:
        print(f"done: metrics in {run_dir / 'metrics.jsonl'}", flush=True)
        print(export.finish(), flush=True)
    elif code == STOPPED:
        print(continue_hint(run_dir), flush=True)
    return code


def command_started_at() -> float:
    """When this process started (its interpreter and imports included): what "command -> first
    step" is measured from. From the kernel's clock ticks since boot (10 ms), not psutil's
    create_time, whose boot time is rounded to the second."""
    import time

    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):  # not Linux
        import psutil

        return psutil.Process().create_time()


STOPPED = 130
"""Supervisor.run's code after Ctrl-C (or SIGTERM)."""


def resume_at(run_dir: Path) -> int:
    """The step a resumed run continues from: its newest complete checkpoint (0: none). The rows of
    steps above it are dropped now (the trainer retrains those steps and writes them again), so the
    console never shows the old ones as new."""
    from streamrl.train.checkpoint import list_checkpoints, truncate_metrics  # torch: only on --resume

    step = max(list_checkpoints(run_dir), default=0)
    truncate_metrics(run_dir, step)
    return step


def continue_hint(run_dir: Path) -> str:
    """What a stopped run prints last: the command that continues it from its newest checkpoint."""
    return f"stopped; continue this run with `streamrl up --resume {run_dir}`"


def _end_run_and_stop_broker(url: str, run: str, code: int, server) -> None:
    """Set the run's end mark (streamrl/core/run_end.py), then stop the embedded server (the one running
    now: restarted if the first died), whatever signals arrive meanwhile: it runs in its own
    session, so nothing else would stop it."""
    from streamrl.core.run_end import end_run

    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if url != "embedded":  # "embedded" here: the server never started, nobody to tell
            end_run(url, run, "streamrl up exited" + ("" if code == 0 else f" with code {code}"))
        if server is not None:
            server.stop()
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class Export:
    """RUN_DIR/hf from the last checkpoint, written while the roles stop and the accounting runs
    (Supervisor's on_trained: the trainer has exited with every step checkpointed), not after them:
    seconds off every job's end. It goes to a staging folder that becomes RUN_DIR/hf only when the
    job succeeds, so a job that fails its accounting leaves no export behind, as before. A failure
    is reported; the finished run stays a success."""

    def __init__(self, run_dir: Path, enabled: bool = True):
        self.out, self.staging = run_dir / "hf", run_dir / ".hf-export"
        self.run_dir = run_dir
        self.enabled = enabled
        """run.export: false makes every method below a no-op but finish's line."""
        self._thread: threading.Thread | None = None
        self._trained = threading.Event()
        self._cancelled = False
        self._error: BaseException | None = None

    def warm(self) -> None:
        """Import what the export needs (transformers, safetensors: seconds) while the job trains,
        in the background, so the export at the end costs only its writes."""
        if not self.enabled:
            return
        self._thread = threading.Thread(target=self._write, name="export", daemon=True)
        self._thread.start()

    def start(self) -> None:
        """Export the final checkpoint (the trainer has exited after its last step)."""
        self._trained.set()
        if self._thread is None and self.enabled:
            self.warm()

    def _write(self) -> None:
        try:
            from streamrl.train.export import export_checkpoint, import_savers

            import_savers()
            self._trained.wait()
            if self._cancelled:
                return
            export_checkpoint(self.run_dir, self.staging)
        except BaseException as exc:  # reported by finish(), in the main thread
            self._error = exc

    def finish(self) -> str:
        """Wait for the export (started now if on_trained was never called); the line to print."""
        if not self.enabled:
            return (
                f"model: not exported (run.export=false); `streamrl export {self.run_dir} --out {self.out}` writes it"
            )
        self.start()
        self._thread.join()
        if self._error is None:
            shutil.rmtree(self.out, ignore_errors=True)  # an earlier export of this run (--resume)
            self.staging.rename(self.out)
            return f"model: {self.out}"
        shutil.rmtree(self.staging, ignore_errors=True)
        exc = self._error
        return (
            f"export failed ({type(exc).__name__}: {exc}); retry with `streamrl export {self.run_dir} --out {self.out}`"
        )

    def discard(self) -> None:
        """The job did not succeed: no export (one already written is removed)."""
        if self._thread is not None:
            self._cancelled = not self._trained.is_set()
            self._trained.set()
            self._thread.join()
        shutil.rmtree(self.staging, ignore_errors=True)
