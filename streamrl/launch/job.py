"""One whole job on this machine, from a validated config: the embedded broker (broker.url=embedded),
every role under the Supervisor, the run's end mark, the accounting and the export of its last
checkpoint. What `streamrl up` runs, and what the Python API's `streamrl.run` / `streamrl.start` run.

    job = prepare_job(cfg, run_dir=None, say=print)   # pre-flight, run dir, lock: errors before anything starts
    code = job.run()                                  # blocks until the job ends; 0, STOPPED, or a failure code
    job.request_stop()                                # from another thread: as Ctrl-C (twice: force)
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
from pathlib import Path
from typing import Callable

from streamrl.config.schema import Config
from streamrl.core.errors import ConfigError
from streamrl.launch.rundir import claim, clear_unstarted, earlier_run, new_run_dir

STOPPED = 130
"""Supervisor.run's code after Ctrl-C (or SIGTERM, or request_stop)."""


def prepare_job(
    cfg: Config,
    run_dir: str | Path | None = None,
    resume: bool = False,
    check: bool = True,
    say: Callable[[str], None] = print,
    command: str = "streamrl up",
    started_at: float | None = None,
    verbose: bool = False,
) -> "LocalJob":
    """Check `cfg` against this machine (`check`: streamrl/launch/preflight.py), resolve its model,
    create and lock the run directory (`run_dir`, or a new folder under runs/) and return the job,
    not started. A ConfigError here leaves nothing behind: no run directory, no process.
    `resume`: continue the run already in `run_dir` (its newest checkpoint); without it a run
    directory an earlier job used is refused. `verbose`: the full step line on the console (RUN_DIR/logs/
    steps.log has it either way)."""
    from streamrl.core.progress_bars import quiet_progress_bars
    from streamrl.launch.preflight import require
    from streamrl.models.chat_template import prompt_format
    from streamrl.models.tiny import resolve_model

    quiet_progress_bars()  # before this process or the roles it starts load a model
    if check:
        require(cfg)
    cfg = resolve_model(cfg)
    # Only now: a config error above leaves no empty run directory behind.
    if run_dir:
        run_dir = Path(run_dir).resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
    else:
        run_dir = new_run_dir(Path("runs"), cfg.run.name)
    lock = claim(run_dir)  # held until the job ends (or this process does)
    if not resume and (used := earlier_run(run_dir)):
        lock.close()
        raise ConfigError(
            f"--run-dir {run_dir} already holds a run ({used}); continue it with "
            f"`streamrl up --resume {run_dir}`, or pass another --run-dir (or none: a new "
            "folder under runs/)"
        )
    if not resume and (removed := clear_unstarted(run_dir)):
        say(
            f"{run_dir}: an earlier `streamrl up` stopped there before its first step; starting afresh "
            f"(removed {', '.join(removed)}; logs/ kept)"
        )
    say(f"{command}: run '{cfg.run.name}' in {run_dir}")
    say(prompt_format(cfg))
    if warning := cfg.broker.inline_password_warning():
        say(warning)
    return LocalJob(cfg, run_dir, lock, resume, say, started_at, verbose)


class LocalJob:
    """A prepared job (prepare_job); `run()` runs it to its end in the calling thread."""

    def __init__(
        self, cfg: Config, run_dir: Path, lock, resume: bool, say, started_at: float | None, verbose: bool = False
    ):
        self.cfg = cfg
        self.run_dir = run_dir
        self.say = say
        self.summary: dict | None = None
        """RUN_DIR/summary.json's accounting once the job ended (None: the broker was unreachable)."""
        self._lock, self._resume, self._started_at, self._verbose = lock, resume, started_at, verbose
        self._supervisor = None
        self._stops = 0
        self._mutex = threading.Lock()

    def request_stop(self) -> None:
        """Ask the job to stop, as Ctrl-C does: every role finishes its current work, the trainer
        checkpoints; a second call kills every role. Safe from any thread."""
        with self._mutex:
            self._stops += 1
            if self._supervisor is not None:
                self._supervisor.request_stop()

    def run(self) -> int:
        """Start the broker and every role, print progress, and return the job's code: 0 done, STOPPED
        (130) stopped, 3 accounting invariant violated; a role that died for good raises WorkerDied.
        The run directory stays locked until it returns."""
        try:
            return self._run()
        finally:
            self._lock.close()

    def _run(self) -> int:
        from streamrl.launch.supervisor import Supervisor

        cfg, run_dir, say = self.cfg, self.run_dir, self.say
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
                say(f"embedded broker on 127.0.0.1:{embedded.port}{via} (password in {run_dir / 'broker' / 'url'})")
            sup = Supervisor(
                cfg,
                run_dir,
                url,
                say=say,
                broker_server=embedded,
                resumed_at=resume_at(run_dir) if self._resume else None,
                on_first_step=export.warm,
                on_trained=export.start,
                started_at=self._started_at,
                verbose=self._verbose,
            )
            with self._mutex:
                self._supervisor = sup
                for _ in range(self._stops):  # asked before the supervisor existed
                    sup.request_stop()
            code = sup.run()
            self.summary = sup.summary
        finally:
            # Producers of the run see it end (and leave) before the broker goes away under them; the
            # broker goes last, after every role drained and the accounting read it.
            _end_run_and_stop_broker(
                url,
                cfg.run.name,
                code,
                sup.broker_watch.server if sup is not None else embedded,
                sup.stop_reason if sup is not None else None,
            )
            from streamrl.weights.shm import shm_root

            # This run's host-local weights and copies (shm, dir and torchstore backends); keyed by the
            # run dir, so another job of the same run.name keeps its own.
            shutil.rmtree(shm_root(cfg.run.name, run_dir), ignore_errors=True)
            if code != 0:
                export.discard()
        from streamrl.train.sink_paths import sink_lines

        for line in sink_lines(cfg, run_dir):  # where W&B / TensorBoard wrote, and how to look
            say(line)
        if code == 0:
            say(f"done: metrics in {run_dir / 'metrics.jsonl'}")
            say(export.finish())
        elif code == STOPPED:
            say(continue_hint(run_dir))
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


def resume_at(run_dir: Path) -> int:
    """The step a resumed run continues from: its newest complete checkpoint (0: none). The rows of
    steps above it are dropped now (the trainer retrains those steps and writes them again), so the
    console never shows the old ones as new."""
    from streamrl.train.checkpoint import list_checkpoints, truncate_metrics  # torch: only on --resume

    step = max(list_checkpoints(run_dir), default=0)
    truncate_metrics(run_dir, step)
    return step


def already_trained(run_dir: Path, steps: int) -> str | None:
    """What `up --resume` says, and nothing starts, when the run's newest checkpoint already reached
    trainer.steps (the trainer would load it and stop at once); None when there is training left."""
    from streamrl.train.checkpoint import list_checkpoints  # torch: only on --resume

    newest = max(list_checkpoints(run_dir), default=0)
    if newest < steps:
        return None
    return (
        f"nothing to resume: {run_dir} already trained {newest} steps (trainer.steps={steps}), so no role "
        f"was started. To train further, raise trainer.steps: `streamrl up --resume {run_dir} --set "
        f"trainer.steps={newest + steps}`; to evaluate the checkpoint: `streamrl eval {run_dir}`"
    )


def continue_hint(run_dir: Path) -> str:
    """What a stopped run prints last: the command that continues it from its newest checkpoint."""
    return f"stopped; continue this run with `streamrl up --resume {run_dir}`"


def _end_run_and_stop_broker(url: str, run: str, code: int, server, why: str | None = None) -> None:
    """Set the run's end mark (streamrl/core/run_end.py; `why`: a role's fatal error that stopped it),
    then stop the embedded server (the one running
    now: restarted if the first died), whatever signals arrive meanwhile: it runs in its own
    session, so nothing else would stop it. (Signals are held off only in the main thread, the one
    that receives them; a job run in another thread by the Python API is stopped through request_stop.)"""
    from streamrl.core.run_end import end_run

    main = threading.current_thread() is threading.main_thread()
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        if url != "embedded":  # "embedded" here: the server never started, nobody to tell
            end_run(url, run, why or ("streamrl up exited" + ("" if code == 0 else f" with code {code}")))
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
