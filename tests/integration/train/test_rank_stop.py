"""A stop signal to a trainer of spawned ranks (streamrl.train.dist.launch) reaches rank 0 once, every rank
takes part in rank 0's last collectives (the stop checkpoint's), and the launching process waits for them.

`streamrl up` stops a role with SIGTERM to its pid. Before launch passed it on, the launcher died of it,
the ranks got torch's parent-death SIGINT (rank 1 left on it) and the supervisor SIGKILLed the group:
CI's test_faults saw a resumed 2-rank trainer stopped at step 10 with checkpoint 9. A terminal's Ctrl-C
(a real pty here) reaches every rank at once: the launcher must not pass on a second one. torchrun passes
the SIGTERM it gets to every rank: ranks > 0 leave the stop to rank 0 there too."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from streamrl.train.dist import broadcast_object, launch

ROOT = Path(__file__).resolve().parents[3]


def _rank(out: str, rank: int, world: int) -> None:
    """Rank 0 as the trainer worker is (its stop handler: the first signal drains, a second exits at once);
    ranks > 0 as streamrl.train.rank_step.follow is: orders until the stop order."""
    if rank > 0:
        while (order := broadcast_object(None)) is not None:
            if order == "save":
                dist.all_reduce(torch.ones(1))
        return
    signals: list[str] = []

    def on_signal(signum, _frame):
        signals.append(signal.Signals(signum).name)
        if len(signals) > 1:
            os._exit(130)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    broadcast_object("step")
    Path(out, "ready").touch()
    while not signals:
        broadcast_object("step")
        time.sleep(0.05)
    time.sleep(1.0)  # the stop checkpoint takes a while: a rank or launcher that left is noticed
    broadcast_object("save")
    total = torch.ones(1)
    dist.all_reduce(total)
    broadcast_object(None)
    Path(out, "result.json").write_text(json.dumps({"ranks_in_last_collective": int(total.item()), "signals": signals}))


def _rank_still_starting(out: str, rank: int, world: int) -> None:
    """Rank 0 stopped before it has a handler (the trainer loading its model); rank 1 waits for orders."""
    if rank == 0:
        Path(out, "ready").touch()
        time.sleep(120)
    broadcast_object(None)


def job(out: str) -> None:
    """The launching process (what `streamrl worker trainer` runs with trainer.world_size=2)."""
    from functools import partial

    launch(2, partial(_rank, out))


def job_still_starting(out: str) -> None:
    from functools import partial

    launch(2, partial(_rank_still_starting, out))


CMD = [sys.executable, "-c", f"import sys; from {__name__} import job; job(sys.argv[1])"]


def _wait_ready(out: Path, alive) -> None:
    deadline = time.time() + 120
    while not (out / "ready").exists():
        assert alive(), "the job ended before its ranks were ready"
        assert time.time() < deadline, "ranks not ready in 120 s"
        time.sleep(0.1)


def _result(out: Path) -> dict:
    return json.loads((out / "result.json").read_text())


def test_sigterm_to_the_launcher_stops_both_ranks_after_the_last_collective(tmp_path):
    # As `streamrl up` does: its own session, SIGTERM to the role's pid only.
    proc = subprocess.Popen([*CMD, str(tmp_path)], cwd=ROOT, start_new_session=True)
    try:
        _wait_ready(tmp_path, lambda: proc.poll() is None)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert proc.poll() is None  # the launcher waits for its ranks (rank 0 is still saving)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert _result(tmp_path) == {"ranks_in_last_collective": 2, "signals": ["SIGTERM"]}


def test_a_stop_while_rank_0_is_still_starting_ends_the_trainer_quietly(tmp_path):
    # Rank 0 dies of the SIGTERM passed to it: nothing was trained, so that is no failure to report.
    cmd = [sys.executable, "-c", f"import sys; from {__name__} import job_still_starting as j; j(sys.argv[1])"]
    proc = subprocess.Popen([*cmd, str(tmp_path)], cwd=ROOT, start_new_session=True, stderr=subprocess.PIPE, text=True)
    try:
        _wait_ready(tmp_path, lambda: proc.poll() is None)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0 and "RankFailed" not in err, err[-2000:]


def test_ctrl_c_in_a_terminal_stops_both_ranks_after_the_last_collective(tmp_path):
    pid, master = pty.fork()
    if pid == 0:  # the child: a session leader whose controlling terminal is the pty
        os.chdir(ROOT)
        os.execv(CMD[0], [*CMD, str(tmp_path)])
    os.set_blocking(master, False)
    try:
        _wait_ready(tmp_path, lambda: os.waitpid(pid, os.WNOHANG) == (0, 0))
        os.write(master, b"\x03")  # Ctrl-C: the terminal sends SIGINT to its foreground group (every rank)
        deadline, status = time.time() + 60, None
        while status is None and time.time() < deadline:
            try:
                os.read(master, 65536)  # drain the job's output, so it never blocks on a full pty
            except OSError:
                pass
            done, code = os.waitpid(pid, os.WNOHANG)
            status = code if done else None
            time.sleep(0.05)
        assert status is not None and os.waitstatus_to_exitcode(status) == 0, status
    finally:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.close(master)
    assert _result(tmp_path) == {"ranks_in_last_collective": 2, "signals": ["SIGINT"]}


def test_sigterm_to_torchrun_stops_both_ranks_after_the_last_collective(tmp_path):
    # As a service manager stops a multi-host trainer: SIGTERM to torchrun, which sends it to every rank.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    proc = subprocess.Popen([*cmd, "-m", __name__, str(tmp_path)], cwd=ROOT, start_new_session=True)
    try:
        _wait_ready(tmp_path, lambda: proc.poll() is None)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)  # torchrun itself exits non-zero after a signal: the ranks' result is the point
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert _result(tmp_path) == {"ranks_in_last_collective": 2, "signals": ["SIGTERM"]}


if __name__ == "__main__":  # torchrun's entry point in the test above
    job(sys.argv[1])
