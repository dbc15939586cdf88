"""The Python API: a whole job from a Python script or notebook, the same job `streamrl up` runs
(streamrl/launch/job.py), with the same config validation and pre-flight. `import streamrl` exposes
these names lazily (streamrl/__init__.py); docs/python-api.md is the guide, examples/python_api.py a
complete script.

    import streamrl

    def score(prompt: str, completion: str, meta: dict) -> float:   # at module level: roles import it
        ...

    if __name__ == "__main__":                       # the roles import this script: no job at import
        config = streamrl.load_config("tiny-cpu", {"trainer.steps": 20}, reward={"fn": score})
        result = streamrl.run(config)                # blocks; Ctrl-C stops it as in `streamrl up`
        job = streamrl.start(config)                 # or a handle: job.step, job.metrics, job.stop(), job.wait()
"""

from __future__ import annotations

import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from streamrl.config.build import make_config
from streamrl.config.schema import Config
from streamrl.core.errors import ConfigError, StreamRLError
from streamrl.core.imports import importing_script

POLL_S = 0.5
"""How often Job.rows() looks for new metrics rows."""
WAIT_TICK_S = 0.1
"""Job.wait's sleep between looks at the job's end. Not Thread.join: a KeyboardInterrupt inside join
leaves the thread looking ended while it runs (CPython 3.11), and wait() must survive Ctrl-C."""


class JobFailed(StreamRLError):
    """A job ended without finishing its steps (a role died for good) or broke its accounting."""


@dataclass
class Result:
    """What a finished (or stopped) job left: everything also lies in `run_dir`."""

    run_dir: Path
    code: int
    """0: every step trained; 130: stopped (Job.stop, Ctrl-C) with its last steps checkpointed."""
    metrics: list[dict] = field(default_factory=list)
    """RUN_DIR/metrics.jsonl: one row a trainer step (docs/running.md lists the keys)."""
    summary: dict | None = None
    """RUN_DIR/summary.json: the accounting (admitted = trained + dropped + ... + lost; invariant_holds)."""
    model_dir: Path | None = None
    """RUN_DIR/hf, the last checkpoint as a Hugging Face folder (None: run.export=false, or stopped)."""

    @property
    def stopped(self) -> bool:
        return self.code == 130

    @property
    def steps(self) -> int:
        """Trainer steps done (the last metrics row's step)."""
        return self.metrics[-1]["step"] if self.metrics else 0


def _as_config(config: Config | str | Path | None) -> Config:
    return config if isinstance(config, Config) else make_config(config)


def start(
    config: Config | str | Path | None = None,
    *,
    run_dir: str | Path | None = None,
    resume: str | Path | None = None,
    check: bool = True,
    echo: bool = True,
) -> "Job":
    """Start a job in the background of this process and return its handle. `config`: a Config
    (streamrl.load_config, streamrl.Config(...)), a preset name or YAML path, or None (the tiny CPU job;
    with `resume`, the run's own config). `run_dir`: where it writes (default: a new runs/<name>-<time>).
    `resume`: continue the run in that directory from its newest checkpoint. `check`: the pre-flight
    checks of `streamrl up` (reward.fn imports, files and model exist, vLLM imports, ...). `echo`: print
    the console lines `streamrl up` prints (always kept in Job.lines). Bad configs raise ConfigError here,
    before anything starts."""
    from streamrl.launch.job import prepare_job

    if importing_script:
        raise ConfigError(
            f"streamrl.start/run was called while {importing_script[-1]} is imported by path (a role process, or "
            "the pre-flight check, imports your script for its reward function or env class); put the code that "
            'starts the job under `if __name__ == "__main__":`'
        )
    if resume is not None:
        run_dir = Path(resume)
        if not (run_dir / "config.yaml").is_file():
            raise ConfigError(f"resume={str(resume)!r}: no config.yaml there; pass the run directory of an earlier job")
        config = run_dir if config is None else config
    cfg = _as_config(config)
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        if echo:
            print(line, flush=True)

    local = prepare_job(
        cfg, run_dir, resume=resume is not None, check=check, say=say, command="streamrl", started_at=time.time()
    )
    return Job(local, lines)


def run(config: Config | str | Path | None = None, **options) -> Result:
    """Run a job to its end (start's arguments) and return its Result; Ctrl-C stops it as in `streamrl up`
    (the trainer checkpoints, a second Ctrl-C kills every role). Raises JobFailed if it fails."""
    return start(config, **options).wait()


class Job:
    """A running job (streamrl.start): its run directory, its progress as it comes, stop and wait. The
    job runs in a thread of this process, its roles in their own processes; it keeps running until it
    ends or is stopped (this process waits for it before exiting)."""

    def __init__(self, local, lines: list[str]):
        self._local = local
        self.run_dir: Path = local.run_dir
        self.config: Config = local.cfg
        self.lines = lines
        """The console lines so far (`streamrl up`'s: roles ready, one a step, failures, accounting)."""
        self._code: int | None = None
        self._error: BaseException | None = None
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"streamrl-job-{self.config.run.name}")
        self._thread.start()

    def _main(self) -> None:
        try:
            self._code = self._local.run()
        except BaseException as exc:  # re-raised by wait(), in the caller's thread
            self._error = exc
        finally:
            self._ended.set()

    @property
    def metrics(self) -> list[dict]:
        """RUN_DIR/metrics.jsonl's rows so far, one a trainer step."""
        from streamrl.train.metrics import read_metrics

        try:
            return read_metrics(self.run_dir)
        except ValueError:  # a row being written: read again
            time.sleep(0.05)
            return read_metrics(self.run_dir)

    @property
    def step(self) -> int:
        """The last trainer step done (0: none yet)."""
        rows = self.metrics
        return rows[-1]["step"] if rows else 0

    @property
    def done(self) -> bool:
        return self._ended.is_set()

    def rows(self) -> Iterator[dict]:
        """Each metrics row as it comes (from the first), until the job ends; Ctrl-C while it waits for
        the next one stops the job as in wait()."""
        seen = 0
        while True:
            ended = self.done
            rows = self.metrics
            yield from rows[seen:]
            seen = max(seen, len(rows))
            if ended:
                return
            with _sigterm_as_ctrl_c():  # only while waiting here: between rows the caller's code runs
                self._nap(POLL_S)

    def stop(self, wait: bool = True) -> Result | None:
        """Stop the job as Ctrl-C does: every role finishes its current work, the trainer checkpoints;
        a second stop() kills every role. With `wait`, returns the Result once it has ended."""
        self._local.request_stop()
        return self.wait() if wait else None

    def wait(self, timeout: float | None = None) -> Result | None:
        """Block until the job ends and return its Result (None if `timeout` seconds pass first). Ctrl-C
        while waiting stops the job (and waits for it); a second one kills every role. Raises JobFailed
        (or the role's error) if the job failed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with _sigterm_as_ctrl_c():
            while not self._ended.is_set():
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                self._nap(WAIT_TICK_S)
        self._thread.join()  # ended: only its last bytecodes are left
        return self._result()

    def _nap(self, seconds: float) -> None:
        """Sleep while the job runs; Ctrl-C meanwhile stops the job (a second: force)."""
        try:
            time.sleep(seconds)
        except KeyboardInterrupt:
            self._local.request_stop()

    def _result(self) -> Result:
        if self._error is not None:
            raise self._error
        result = Result(self.run_dir, self._code, self.metrics, self._local.summary)
        if self._code == 0 and (self.run_dir / "hf" / "config.json").is_file():
            result.model_dir = self.run_dir / "hf"
        if self._code not in (0, 130):
            why = "its accounting invariant is violated" if self._code == 3 else f"it exited with code {self._code}"
            raise JobFailed(f"the job in {self.run_dir} failed: {why}; see {self.run_dir / 'summary.json'} and logs/")
        return result


@contextmanager
def _sigterm_as_ctrl_c():
    """While the main thread waits on a job, SIGTERM stops it as Ctrl-C does (as `streamrl up` treats
    both): without this, SIGTERM would end this process at once and leave the roles running."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def export(run_dir: str | Path, out: str | Path, step: int | None = None) -> Path:
    """Write checkpoint `step` (default: the newest) of a run as a Hugging Face model folder at `out`
    (as `streamrl export RUN_DIR --out OUT`); returns `out`."""
    from streamrl.train.export import export_checkpoint

    return export_checkpoint(Path(run_dir), Path(out), step)


def check(config: Config | str | Path | None = None) -> Config:
    """Validate `config` and run `streamrl config`'s pre-flight checks against this machine (nothing
    starts); raises ConfigError naming every problem, returns the Config."""
    from streamrl.launch.preflight import require

    cfg = _as_config(config)
    require(cfg)
    return cfg
