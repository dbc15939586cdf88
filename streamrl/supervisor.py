"""`streamrl up`: start the broker and every role with its configured count, stream progress,
stop everything when training ends (or on Ctrl-C), and name the role that died if one does.

    streamrl up --config configs/tiny-cpu.yaml --run-dir runs/demo

Each role is its own process (`streamrl worker ROLE ...`) with its output in RUN_DIR/logs/.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from streamrl.config import Config, dump_config
from streamrl.errors import WorkerDied
from streamrl.metrics import read_metrics

GRACE_S = 15.0
SCALE_FILE = "scale.json"
"""Desired counts per role, written by `streamrl scale` into the run directory and polled by `up`."""
SCALABLE_ROLES = ("generator", "reward", "reference")


@dataclass
class Child:
    role: str
    worker_id: str
    proc: subprocess.Popen
    log_path: Path


def describe_exit(code: int) -> str:
    if code < 0:
        name = signal.Signals(-code).name
        hint = " — likely out of memory (the kernel's OOM killer sends SIGKILL)" if -code == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exited with code {code}"


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


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
        "reference": cfg.reference.count if cfg.loss.kl_beta > 0 else 0,
    }


class Supervisor:
    def __init__(self, cfg: Config, run_dir: Path, broker_url: str, say=print):
        self.cfg = cfg
        self.run_dir = run_dir
        self.broker_url = broker_url
        self.say = say
        self.children: list[Child] = []
        self.config_path = run_dir / "config.yaml"
        self._stop_requested = 0
        self._printed = 0
        self.retiring: list[Child] = []
        """Children asked to leave by `streamrl scale` (SIGTERM sent), until they exit."""

    def spawn(self, role: str, index: int) -> Child:
        wid = f"{role}-{index}"
        log_path = self.run_dir / "logs" / f"{wid}.out"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "streamrl.cli", "worker", role, "--config", str(self.config_path),
               "--run-dir", str(self.run_dir), "--id", wid]
        env = {**os.environ, "STREAMRL_BROKER_URL": self.broker_url, "PYTHONUNBUFFERED": "1"}
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        child = Child(role, wid, proc, log_path)
        self.children.append(child)
        return child

    def _on_signal(self, signum, _frame) -> None:
        self._stop_requested += 1
        if self._stop_requested == 1:
            self.say("stopping: asking every role to finish its current work (Ctrl-C again to force)")
        else:
            self.say("forcing: killing every role")
            for c in self.children:
                kill_group(c.proc)

    def run(self) -> int:
        dump_config(self.cfg, self.config_path)
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            for role, n in role_counts(self.cfg).items():
                for i in range(n):
                    self.spawn(role, i)
            self.say(f"started {', '.join(f'{n} {r}' for r, n in role_counts(self.cfg).items() if n)}; "
                     f"logs in {self.run_dir / 'logs'}")
            return self._watch()
        finally:
            self.children += self.retiring
            self.stop_all()
            for s, h in old.items():
                signal.signal(s, h)

    def _watch(self) -> int:
        trainer = next(c for c in self.children if c.role == "trainer")
        while True:
            self._progress()
            self.apply_scale()
            if self._stop_requested:
                return 130
            code = trainer.proc.poll()
            if code == 0:
                self._progress()
                return 0
            for c in self.children:
                code = c.proc.poll()
                if code is not None:
                    raise WorkerDied(f"{c.worker_id} ({c.role}) {describe_exit(code)}; last lines of "
                                     f"{c.log_path}:\n{tail(c.log_path)}")
            time.sleep(0.5)

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
            self.say(f"{c.worker_id} left ({describe_exit(c.proc.returncode)})")
        for role, want in self.desired_counts().items():
            live = sorted((c for c in self.children if c.role == role), key=lambda c: int(c.worker_id.rsplit("-", 1)[1]))
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
        rows = read_metrics(self.run_dir)
        for m in rows[self._printed:]:
            tps = m["tokens"] / max(1e-9, m.get("train_s", 0) + m.get("wait_s", 0))
            self.say(f"step {m['step']:>4}/{self.cfg.trainer.steps} | reward {m['reward_mean']:.3f} | "
                     f"staleness max {m['staleness_max']} | {m['samples']} samples, {m['tokens']} tokens "
                     f"({tps:,.0f} tok/s) | wait {m['wait_s']:.2f}s train {m['train_s']:.2f}s | t={m['time_s']:.0f}s")
        self._printed = len(rows)

    def stop_all(self) -> None:
        live = [c for c in self.children if c.proc.poll() is None]
        for c in live:
            c.proc.send_signal(signal.SIGTERM)
        deadline = time.time() + GRACE_S
        for c in live:
            try:
                c.proc.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                self.say(f"{c.worker_id} did not stop within {GRACE_S:.0f}s; killing it")
                kill_group(c.proc)
                c.proc.wait()
        for c in self.children:  # ranks or engine processes a role started, if it left any
            kill_group(c.proc)
