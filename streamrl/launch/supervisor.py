"""`streamrl up`: start the broker and every role with its configured count, stream progress,
stop everything when training ends (or on Ctrl-C), and name the role that died if one does.

    streamrl up --config configs/tiny-cpu.yaml --run-dir runs/demo

Each role is its own process (`streamrl worker ROLE ...`) with its output in RUN_DIR/logs/.
A crashed role is restarted with back-off (supervisor.*; streamrl/launch/recovery.py), the embedded
broker too; at the end the accounting invariant is checked and written to RUN_DIR/summary.json.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from streamrl.config.files import dump_config
from streamrl.config.rollout import EXTERNAL
from streamrl.config.schema import Config
from streamrl.core.errors import ENGINE_HUNG_PREFIX, EXIT_ENGINE_START_HUNG, EXIT_NO_RESTART, WorkerDied
from streamrl.launch.cpu_threads import host_cores, is_gpu_host, threads_per_role
from streamrl.launch.env_watch import EnvWatch, NoEnvWatch
from streamrl.launch.failures import DeadLetterWatch
from streamrl.launch.leftovers import ProcessTree, describe_removed
from streamrl.launch.log_noise import strip_leak_report
from streamrl.launch.oom import OomMark, OomWatch
from streamrl.launch.progress import Progress
from streamrl.launch.recovery import BrokerWatch, RestartPolicy, describe_exit
from streamrl.launch.startup_watch import StartupWatch
from streamrl.train.metrics import read_metrics

SCALE_FILE = "scale.json"
"""Desired counts per role, written by `streamrl scale` into the run directory and polled by `up`."""
SCALABLE_ROLES = ("generator", "reward", "reference", "judge", "env")
WATCH_INTERVAL_S = 0.5
"""How often `up` reads the metrics, scale file and broker watches while the job runs."""


@dataclass
class Child:
    role: str
    worker_id: str
    proc: subprocess.Popen
    log_path: Path
    restarts: int = 0
    restart_at: float | None = None
    """Set while the child waits out its restart back-off."""
    tree: ProcessTree = field(default_factory=ProcessTree)
    """Its processes and shared-memory segments, recorded while it runs (cleaned up after it dies)."""
    oom_mark: OomMark | None = None
    """Where the OOM evidence stood when it started (streamrl.launch.oom)."""


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


def fatal_line(path: Path, prefix: str | None = None) -> str:
    """The error a role printed before exiting with EXIT_NO_RESTART (streamrl.launch.runtime.print_fatal),
    or its last line starting with `prefix` (without it)."""
    from streamrl.launch.runtime import FATAL_PREFIX

    prefix = prefix or FATAL_PREFIX
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return next((ln[len(prefix) :] for ln in reversed(lines) if ln.startswith(prefix)), "")


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL a child's whole process group (its trainer ranks, vLLM engine core)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def role_counts(cfg: Config) -> dict[str, int]:
    return {
        "trainer": 1,
        "feeder": 1,
        "generator": cfg.generator.count,
        "reward": cfg.reward.count,
        # reference.source=trainer resolves reference.count to 0: the trainer computes them
        "reference": cfg.reference.count if cfg.loss.kl_beta > 0 and not cfg.reference_in_trainer() else 0,
        "judge": cfg.judge.count if cfg.judge is not None else 0,
        "env": cfg.env.count if cfg.env.fn and cfg.env.fn != EXTERNAL else 0,
    }


class Supervisor:
    def __init__(
        self,
        cfg: Config,
        run_dir: Path,
        broker_url: str,
        say=print,
        broker_server=None,
        resumed_at: int | None = None,
        on_first_step: Callable[[], None] | None = None,
        on_trained: Callable[[], None] | None = None,
        started_at: float | None = None,
        verbose: bool = False,
    ):
        """`resumed_at`: the checkpoint step a `--resume` continues from (None: a new run).
        `on_first_step`: called once the first step is in (the roles are up; the launcher is idle
        until the end), e.g. to import what the end needs off the start-up's and the end's path.
        `on_trained`: called once the trainer has exited after its last step, before the other roles
        are stopped, so work on the final checkpoint (up's export) overlaps their shutdown.
        `started_at`: when the command started (time.time()), for the console's and summary.json's
        command -> first step figure (first_step_s). `verbose`: the full step line on the console
        (RUN_DIR/logs/steps.log has it either way)."""
        self.cfg = cfg
        self.policy = RestartPolicy(cfg.supervisor)
        self.broker_watch = BrokerWatch(broker_server, cfg.supervisor.restart_broker, say)
        self.summary: dict | None = None
        self.stop_reason: str | None = None
        """Why the job stopped before its end (a role's fatal error), for summary.json and the run's end mark."""
        self.run_dir = run_dir
        self.broker_url = broker_url
        self.say = say
        self.children: list[Child] = []
        self.config_path = run_dir / "config.yaml"
        self._stop_requested = 0
        self.resumed_at = resumed_at
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.progress = Progress(
            cfg.trainer.steps,
            say,
            after_step=resumed_at or 0,
            started_at=started_at,
            verbose=verbose,
            log_path=run_dir / "logs" / "steps.log",
        )
        self.startup = StartupWatch(run_dir, started_at=started_at)
        """Until the first step: each role's readiness and who is still starting (streamrl/launch/startup_watch.py)."""
        self.failures = DeadLetterWatch(broker_url, cfg.run.name)
        """Dead-lettered entries per cause, printed while the job runs (streamrl/launch/failures.py)."""
        self.env_watch = EnvWatch(broker_url, cfg.run.name) if cfg.env.fn == EXTERNAL else NoEnvWatch()
        """env.fn=external: a warning on the console while no env worker has joined."""
        self.spawn_engines: set[str] = set()
        """Workers whose vLLM engine start hung (exit EXIT_ENGINE_START_HUNG): restarted with their
        engine started by spawn (VLLM_WORKER_MULTIPROC_METHOD), never fork again."""
        self.retiring: list[Child] = []
        """Children asked to leave by `streamrl scale` (SIGTERM sent), until they exit."""
        self.oom = OomWatch()
        self.on_trained = on_trained
        self.on_first_step = on_first_step
        self.cpu_threads = (
            None
            if "OMP_NUM_THREADS" in os.environ
            else threads_per_role(cfg, role_counts(cfg), host_cores(), is_gpu_host())
        )
        """OMP_NUM_THREADS given to each role (streamrl/launch/cpu_threads.py); None: the environment's or torch's."""

    def spawn(self, role: str, index: int) -> Child:
        wid = f"{role}-{index}"
        log_path = self.run_dir / "logs" / f"{wid}.out"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        child = Child(role, wid, self._popen(role, wid, log_path), log_path, oom_mark=self.oom.mark())
        self.children.append(child)
        return child

    def _popen(self, role: str, wid: str, log_path: Path) -> subprocess.Popen:
        cmd = [
            sys.executable,
            "-m",
            "streamrl.cli",
            "worker",
            role,
            "--config",
            str(self.config_path),
            "--run-dir",
            str(self.run_dir),
            "--id",
            wid,
        ]
        with open(log_path, "ab") as out:
            return subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=self.child_env(role, wid), start_new_session=True
            )

    def child_env(self, role: str, wid: str) -> dict[str, str]:
        """The environment of a role process: the broker URL and its GPUs (supervisor.devices)."""
        env = {**os.environ, "STREAMRL_BROKER_URL": self.broker_url, "PYTHONUNBUFFERED": "1"}
        if (gpus := self.cfg.supervisor.devices_of(role, int(wid.rsplit("-", 1)[1]))) is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpus
        if self.cpu_threads is not None:
            env["OMP_NUM_THREADS"] = str(self.cpu_threads)
        if wid in self.spawn_engines:
            env["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
        return env

    def _on_death(self, c: Child, code: int) -> None:
        """Report how `c` died; schedule its restart (back-off) or end the run (WorkerDied)."""
        kill_group(c.proc)  # engine processes or ranks it left behind
        strip_leak_report(c.log_path)  # before its tail is quoted
        how = self._how(c)
        if code == EXIT_NO_RESTART and (fatal := fatal_line(c.log_path)):
            self._clean_up(c)
            raise WorkerDied(f"{c.worker_id} ({c.role}) stopped: {fatal} (log: {c.log_path})")
        spawn = ""
        if code == EXIT_ENGINE_START_HUNG:  # streamrl/generate/start_watchdog.py
            hung = fatal_line(c.log_path, ENGINE_HUNG_PREFIX) or "its vLLM engine did not start in time"
            how, spawn = f"{how}: engine start hung: {hung}", " with its vLLM engine started by spawn, not fork"
            self.spawn_engines.add(c.worker_id)
        if not self.policy.allows(c.role, c.restarts, code):
            self._clean_up(c)
            raise WorkerDied(
                f"{c.worker_id} ({c.role}) {how}; {self.policy.refusal(c.role, c.restarts, code)}. "
                f"Last lines of {c.log_path}:\n{tail(c.log_path)}"
            )
        delay = self.policy.delay(c.restarts)
        c.restart_at = time.time() + delay
        self.say(
            f"{c.worker_id} ({c.role}) {how}; restarting in {delay:.1f}s{spawn} "
            f"(restart {c.restarts + 1} of {self.cfg.supervisor.max_restarts})"
        )
        self._clean_up(c)  # during the back-off

    def _respawn(self, c: Child) -> None:
        c.restarts += 1
        c.restart_at = None
        c.tree, c.oom_mark = ProcessTree(), self.oom.mark()
        c.proc = self._popen(c.role, c.worker_id, c.log_path)

    def _how(self, c: Child) -> str:
        """How `c` (dead) ended, with the OOM killer's evidence if there is any."""
        return describe_exit(c.proc.returncode, self.oom.evidence({c.proc.pid, *c.tree.pids}, c.oom_mark))

    def _clean_up(self, c: Child) -> None:
        """Remove what the dead child's tree left in /dev/shm (streamrl/launch/leftovers.py), and the
        exit noise at the end of its log (streamrl/launch/log_noise.py)."""
        strip_leak_report(c.log_path)
        if removed := c.tree.remove_leftovers():
            self.say(f"{c.worker_id}: {describe_removed(removed)}")

    def _record_trees(self) -> None:
        for c in self.children + self.retiring:
            if c.restart_at is None and c.tree.due() and c.proc.poll() is None:
                c.tree.scan(c.proc.pid)

    def _on_signal(self, signum, _frame) -> None:
        self.request_stop()

    def request_stop(self) -> None:
        """Ctrl-C's effect (SIGINT/SIGTERM in the main thread; the Python API's Job.stop from any
        thread): the first asks every role to finish its current work, the next kills every role."""
        self._stop_requested += 1
        if self._stop_requested == 1:
            self.say("stopping: asking every role to finish its current work (Ctrl-C again to force)")
        else:
            self.say("forcing: killing every role")
            for c in self.children:
                kill_group(c.proc)

    def run(self) -> int:
        dump_config(self.cfg, self.config_path)
        # Only the main thread receives signals (and may set handlers); a job the Python API runs in
        # another thread (streamrl.start) is stopped through request_stop.
        main = threading.current_thread() is threading.main_thread()
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
        try:
            for role, n in role_counts(self.cfg).items():
                for i in range(n):
                    self.spawn(role, i)
            self.say(
                f"started {', '.join(f'{n} {r}' for r, n in role_counts(self.cfg).items() if n)}; "
                f"logs in {self.run_dir / 'logs'}"
                + (f"; {self.cpu_threads} CPU thread(s) per role (supervisor.cpu_threads)" if self.cpu_threads else "")
            )
            if self.resumed_at is not None:
                self.say(
                    f"resumed at step {self.resumed_at}/{self.cfg.trainer.steps}"
                    + ("" if self.resumed_at else " (no checkpoint yet: training starts over)")
                )
            if self.cfg.env.fn == EXTERNAL:
                self.say(
                    "env.fn=external: no env worker is started here; episodes wait until one joins "
                    f"(streamrl env --run {self.cfg.run.name} --broker URL ...; `streamrl status` shows it)"
                )
            try:
                code = self._watch()
            except WorkerDied as exc:
                self.stop_reason = str(exc).split("\n", 1)[0]
                raise
            if code == 0 and self.on_trained is not None:
                self.on_trained()
        finally:
            self.children += self.retiring
            self.stop_all()
            # The step the roles finished while stopping (Ctrl-C: the trainer completes and checkpoints
            # its step): on the console too, so it ends where metrics.jsonl and the checkpoint do.
            try:
                self.progress.show(read_metrics(self.run_dir))
            except (OSError, ValueError):  # a row torn by a killed trainer: the accounting still runs
                pass
            try:
                self._account()
            finally:
                # Only now: a Ctrl-C during the accounting must not abort it (the broker still runs).
                for s, h in old.items():
                    signal.signal(s, h)
        if code == 0 and self.summary is not None and not self.summary["invariant_holds"]:
            return 3
        return code

    def _account(self) -> None:
        """Check the accounting invariant (streamrl.core.accounting) and write RUN_DIR/summary.json."""
        from streamrl.core.accounting import write_summary

        if line := self.failures.poll(force=True):  # what the last quiet interval held back
            self.say(line)
        self.failures.close()
        self.env_watch.close()
        try:
            per_group = self.cfg.rollout.group_size if self.cfg.env.fn else 0
            self.summary = s = write_summary(
                self.broker_url,
                self.cfg.run.name,
                self.run_dir,
                per_group,
                self.cfg.rollout.partitions,
                extra={"first_step_s": self.progress.first_step_s, "stop_reason": self.stop_reason},
            )
        except Exception as exc:  # the broker is gone: nothing to account against
            self.say(f"accounting skipped: broker unreachable ({exc})")
            return
        line = (
            f"accounting (groups): admitted {s['admitted']} = trained {s['trained']} + dropped_stale "
            f"{s['dropped_stale']} ({s.get('dropped_stale_frac', 0):.1%}) + filtered {s['filtered']} + failed {s['failed']} + requeued {s['requeued']} "
            f"+ in flight {s['in_flight']} + lost {s['lost']}; double-trained rollouts {s['double_trained']}"
        )
        self.say(
            line
            if s["invariant_holds"]
            else f"ACCOUNTING INVARIANT VIOLATED: {line}; see {self.run_dir / 'summary.json'}"
        )
        if e := s.get("episodes"):
            self.say(
                f"episodes: admitted {e['admitted']} = trained {e['trained']} + failed {e['failed']} + other outcomes "
                f"+ in flight {e['in_flight']} + lost {e['lost']}; {e['episodes_failed']} failed themselves, "
                f"{e['episodes_restarted']} restarted, {e['groups_restarted']} group restarts "
                f"({e.get('episodes_continued', 0)} episodes continued from their last turn)"
            )

    def _watch(self) -> int:
        trainer = next(c for c in self.children if c.role == "trainer")
        while True:
            # Before _progress: a role's ready line comes before the first step's.
            for line in self.startup.poll([c.worker_id for c in self.children], self._first_step_shown()):
                self.say(line)
            self._progress()
            if line := self.failures.poll():
                self.say(line)
            if line := self.env_watch.poll():
                self.say(line)
            self._record_trees()
            self.apply_scale()
            if self._stop_requested:
                return 130
            self.broker_watch.check()
            if trainer.restart_at is None and trainer.proc.poll() == 0 and self._finished():
                self._progress()
                return 0
            for c in self.children:
                if c.restart_at is not None:
                    if time.time() >= c.restart_at:
                        self._respawn(c)
                    continue
                code = c.proc.poll()
                if code is not None:
                    self._on_death(c, code)
            self._pause(trainer)

    def _pause(self, trainer: Child) -> None:
        """The watch loop's interval, cut short by the trainer's exit: the job's end is seen at once,
        not up to a poll later (on every job), while the loop's reads stay at two a second."""
        if trainer.restart_at is None and trainer.proc.poll() is None:
            try:
                trainer.proc.wait(timeout=WATCH_INTERVAL_S)
            except subprocess.TimeoutExpired:
                pass
        else:
            time.sleep(WATCH_INTERVAL_S)

    def _finished(self) -> bool:
        rows = read_metrics(self.run_dir)
        return bool(rows) and rows[-1]["step"] >= self.cfg.trainer.steps

    # -- elastic scaling (`streamrl scale ROLE=N` writes RUN_DIR/scale.json) ---------------------
    def desired_counts(self) -> dict[str, int]:
        """Counts asked for by `streamrl scale` (roles it never named keep their current count)."""
        path = self.run_dir / SCALE_FILE
        try:
            return {r: int(n) for r, n in json.loads(path.read_text()).items() if r in SCALABLE_ROLES}
        except (OSError, ValueError, TypeError, AttributeError):
            return {}  # no file yet, or one being replaced: try again on the next poll

    def apply_scale(self) -> None:
        """Start or stop children so each scaled role runs its desired count; reap the ones that left."""
        for c in [c for c in self.retiring if c.proc.poll() is not None]:
            self.retiring.remove(c)
            kill_group(c.proc)  # its engine processes, if any outlived it
            self.say(f"{c.worker_id} left ({self._how(c)})")
            self._clean_up(c)
        for role, want in self.desired_counts().items():
            live = sorted(
                (c for c in self.children if c.role == role), key=lambda c: int(c.worker_id.rsplit("-", 1)[1])
            )
            for _ in range(want - len(live)):
                used = {c.worker_id for c in self.children + self.retiring}
                index = next(i for i in range(len(used) + 1) if f"{role}-{i}" not in used)
                self.say(f"scale: started {self.spawn(role, index).worker_id} ({role} -> {want})")
            for c in live[want:]:
                # SIGTERM: the worker drains (a generator finishes or un-acks its in-flight groups), and
                # whatever it leaves pending is taken over by the others through XAUTOCLAIM.
                self.children.remove(c)
                self.retiring.append(c)
                c.proc.send_signal(signal.SIGTERM)
                self.say(f"scale: stopping {c.worker_id} ({role} -> {want})")

    def _progress(self) -> None:
        self.progress.show(read_metrics(self.run_dir))
        if self.on_first_step is not None and self._first_step_shown():
            hook, self.on_first_step = self.on_first_step, None
            hook()

    def _first_step_shown(self) -> bool:
        """Whether the console has shown a step of this run (a resumed run's first is past resumed_at)."""
        return self.progress.shown > (self.resumed_at or 0)

    def stop_all(self) -> None:
        live = [c for c in self.children if c.proc.poll() is None]
        for c in live:
            c.proc.send_signal(signal.SIGTERM)
        grace = self.cfg.supervisor.grace_s
        deadline = time.time() + grace
        for c in live:
            try:
                c.proc.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                self.say(f"{c.worker_id} did not stop within {grace:.0f}s; killing it")
                kill_group(c.proc)
                c.proc.wait()
        for c in self.children:  # ranks or engine processes a role started, if it left any
            kill_group(c.proc)
        for c in self.children:  # segments of the ones killed here (a clean exit unlinks its own)
            self._clean_up(c)
