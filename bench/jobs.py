"""Whole jobs from outside: `streamrl up` (and the other CLI commands) as subprocesses, and the readers
of what a run directory holds (metrics.jsonl, summary.json, the broker's URL). The one harness of the
e2e tests (tests/e2e) and of the benchmarks that run real jobs (bench e2e, objectives, recovery, soak).

    from bench.jobs import Job, up, metrics, summary
    res = up(run_dir, "trainer.steps=3")                 # to its end: a CompletedProcess, output captured
    job = Job(run_dir, "trainer.steps=40", *QUICK_RECOVERY)   # in the background, output in a file
    job.wait_step(2); job.kill_role("tiny", "generator"); assert job.wait() == 0
    assert_exact(job.summary())

It lives in bench/ because a benchmark never imports tests/ (the tests import it from here), and it
is not library code: it drives the CLI as a user does, through its arguments and its files.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis

from streamrl.core.broker import Keys

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"

QUICK_RECOVERY = (
    "broker.claim_idle_ms=2000",
    "generator.drain_timeout_s=2",
    "supervisor.backoff_s=0.5",
    "supervisor.grace_s=30",
    "trainer.trim_every_s=2",
    "rollout.max_staleness=1",
    "run.export=false",  # no RUN_DIR/hf: what a fault job checks is elsewhere (test_up checks the export)
)
"""Settings of a job whose roles are killed on purpose: a dead consumer's entries are claimed after 2 s,
a role restarts after 0.5 s, a stopping generator hands back its groups within 2 s."""


def cli_args(*args: str) -> list[str]:
    """The command line of `streamrl ARGS` run by this interpreter (the tree on PYTHONPATH)."""
    return [sys.executable, "-m", "streamrl.cli", *args]


def config_path(config: str | Path) -> Path:
    """A config by its path (made absolute: jobs run in the repository root) or by its name in configs/
    ("tiny-judge-cpu.yaml")."""
    path = Path(config)
    return path.resolve() if path.exists() else CONFIGS / path


def up_args(run_dir: Path, *sets: str, config: str | Path | None = None, resume: bool = False) -> list[str]:
    """The command line of `streamrl up` into `run_dir` with `--set` for each of `sets`. No config: up's
    default (configs/tiny-cpu.yaml); `resume`: `up --resume run_dir` (the run's own config). The run
    directory is made absolute: jobs run in the repository root, their caller's files may not."""
    run_dir = Path(run_dir).resolve()
    cmd = cli_args("up")
    if resume:
        cmd += ["--resume", str(run_dir)]
    else:
        cmd += ["--config", str(config_path(config))] if config is not None else []
        cmd += ["--run-dir", str(run_dir)]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def with_pythonpath(*paths: str | Path) -> dict:
    """os.environ with `paths` in front of PYTHONPATH (a module the job imports from outside the tree)."""
    parts = [str(p) for p in paths] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(parts)}


def run_cli(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """`streamrl ARGS` to its end, its output captured as text."""
    return subprocess.run(cli_args(*args), cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def up(
    run_dir: Path, *sets: str, config: str | Path | None = None, timeout: float = 900, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`streamrl up` to its end, its output captured as text."""
    cmd = up_args(run_dir, *sets, config=config)
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def metrics(run_dir: Path) -> list[dict]:
    """The trainer's rows of RUN_DIR/metrics.jsonl, one a step ([] before the first)."""
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in metrics(run_dir)]


def summary(run_dir: Path) -> dict:
    """RUN_DIR/summary.json: the run's accounting, written when `up` ends."""
    return json.loads((Path(run_dir) / "summary.json").read_text())


def log_events(run_dir: Path, worker: str) -> list[dict]:
    """The structured log lines of one worker (RUN_DIR/logs/WORKER.jsonl); of a running worker, a line
    still being written (no closing brace yet) is left out."""
    path = Path(run_dir) / "logs" / f"{worker}.jsonl"
    lines = path.read_text(errors="replace").splitlines()
    return [json.loads(ln) for ln in lines if ln.startswith("{") and ln.endswith("}")]


def broker(run_dir: Path) -> redis.Redis:
    """A client of the job's broker (RUN_DIR/broker/url, written once `up` started it)."""
    return redis.Redis.from_url((Path(run_dir) / "broker" / "url").read_text().strip())


def heartbeat(client: redis.Redis, run: str, role: str, worker: str) -> dict:
    """A worker's heartbeat ({} when it has none: not started yet, or left)."""
    raw = client.get(Keys(run).worker(role, worker))
    return json.loads(raw) if raw else {}


def assert_exact(s: dict, in_flight_ok: bool = True) -> None:
    """The accounting invariant of summary.json: every admitted group is in exactly one outcome, nothing
    lost or trained twice (`in_flight_ok=False`: and none left in flight, a run that ran to its end)."""
    parts = ("trained", "dropped_stale", "filtered", "failed", "requeued", "in_flight", "lost")
    assert s["admitted"] == sum(s[k] for k in parts), s
    assert s["lost"] == 0 and s["double_trained"] == 0, s
    assert s["invariant_holds"], s
    assert in_flight_ok or s["in_flight"] == 0, s


class Job:
    """One `streamrl up` in the background and the run directory it writes; its output (stdout and
    stderr) goes to `out` (default: a new file beside the run directory)."""

    def __init__(
        self,
        run_dir: Path,
        *sets: str,
        config: str | Path | None = None,
        resume: bool = False,
        out: Path | None = None,
        env: dict | None = None,
        new_session: bool = False,
    ):
        self.run_dir = Path(run_dir)
        self.run_dir.parent.mkdir(parents=True, exist_ok=True)
        self.out_path = out or self.run_dir.parent / f"{self.run_dir.name}-up-{time.time_ns()}.out"
        self._out = open(self.out_path, "wb")
        # new_session: `up` leads its own process group, as a shell's foreground job does
        self.proc = subprocess.Popen(
            up_args(self.run_dir, *sets, config=config, resume=resume),
            cwd=ROOT,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=new_session,
        )

    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def metrics(self) -> list[dict]:
        return metrics(self.run_dir)

    def steps(self) -> list[int]:
        return steps(self.run_dir)

    def summary(self) -> dict:
        return summary(self.run_dir)

    def wait_for(self, what: str, cond, timeout: float = 400, every: float = 0.3):
        """Until `cond()` is true (returns it); fails with the output's tail when `up` ends first or time runs out."""
        deadline = time.time() + timeout
        while not (got := cond()):
            assert self.alive(), f"up exited ({self.proc.returncode}) before {what}:\n{self.output()[-4000:]}"
            assert time.time() < deadline, f"timed out waiting for {what}:\n{self.output()[-4000:]}"
            time.sleep(every)
        return got

    def wait_step(self, n: int, timeout: float = 400) -> None:
        self.wait_for(f"step {n}", lambda: (s := self.steps()) and s[-1] >= n, timeout)

    def wait_output(self, text: str, timeout: float = 120) -> None:
        self.wait_for(f"{text!r} printed", lambda: text in self.output(), timeout, every=0.1)

    def wait_broker(self, timeout: float = 120) -> None:
        """Until `up` has started the broker (RUN_DIR/broker/url) and written RUN_DIR/config.yaml (which the
        commands on a live run read: `scale`, `status`; it is written just after the broker starts)."""
        ready = (self.run_dir / "broker" / "url", self.run_dir / "config.yaml")
        self.wait_for("the broker", lambda: all(p.exists() for p in ready), timeout, every=0.2)

    def wait_checkpointed(self, run: str, version: int, timeout: float = 120) -> None:
        """Until the broker marks checkpoint `version` complete (it is written in the background)."""
        with self.redis() as r:
            mark = Keys(run).trainer_checkpointed
            self.wait_for(f"checkpoint {version} marked", lambda: int(r.get(mark) or 0) >= version, timeout, 0.1)

    def wait(self, timeout: float = 600) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._out.close()

    def stop(self, sig: int = signal.SIGINT, timeout: float = 120) -> None:
        """Stop `up` if it still runs (it stops its roles and its broker); SIGKILL when it does not."""
        if self.alive():
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.wait(30)

    def redis(self) -> redis.Redis:
        return broker(self.run_dir)

    def kill_role(self, run: str, role: str) -> int:
        """SIGKILL the live process of `<role>-0` (its pid from its heartbeat)."""
        with self.redis() as r:
            pid = heartbeat(r, run, role, f"{role}-0").get("pid")
        assert pid, f"no heartbeat for {role}-0 of run {run}"
        os.kill(pid, signal.SIGKILL)
        return pid

    def kill_broker(self) -> int:
        with self.redis() as r:
            pid = int(r.info("server")["process_id"])
        os.kill(pid, signal.SIGKILL)
        return pid
