"""The console's view of training: one line per trainer step from RUN_DIR/metrics.jsonl, and a
warning when the job has stopped learning (streamrl up; streamrl/launch/supervisor.py).

    p = Progress(total_steps=20, say=print, after_step=8)   # a resumed run: steps 1..8 were shown before
    p.show(read_metrics(run_dir))                           # prints the rows above what it printed

    step    9/20 | reward 0.250 | loss 0.012 kl 0.0031 ent 1.42 gnorm 0.87 | staleness 1 | 812 trained tok/s | elapsed 1m04s, ETA 1m30s
"""

from __future__ import annotations

import time
from pathlib import Path

NO_SIGNAL_STEPS = 3
"""Consecutive steps in which every group's rewards were equal (zero_variance_frac == 1: every
advantage 0) before the console warns that the job is not learning."""

NO_SIGNAL_FIX = (
    "every group's rewards were equal (all advantages 0): the model gets no gradient from the reward. "
    "Check the reward on a few completions (`streamrl samples RUN_DIR`, `streamrl reward`), raise "
    "rollout.group_size or generator.temperature, or use loss.dynamic_sampling=true to skip such groups"
)


def optim_part(m: dict) -> str:
    """loss, KL, entropy, grad norm in a compact form (those the objective logged); pure."""
    names = (("loss", "loss", ".3g"), ("kl", "kl", ".2g"), ("entropy", "ent", ".3g"), ("grad_norm", "gnorm", ".3g"))
    parts = [f"{short} {m[key]:{fmt}}" for key, short, fmt in names if isinstance(m.get(key), (int, float))]
    return " ".join(parts)


def duration(seconds: float) -> str:
    """45s, 3m12s, 1h05m; pure."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def eta_s(first: dict, m: dict, total_steps: int) -> float | None:
    """Seconds to the last step at the pace from row `first` to row `m` (their time_s); None with
    no pace yet (one row); pure."""
    steps = m["step"] - first["step"]
    if steps <= 0:
        return None
    return max(0.0, (m["time_s"] - first["time_s"]) / steps * (total_steps - m["step"]))


def _tail_parts(m: dict) -> str:
    """What both lines end with when it happened: episodes, failed and stale groups, eval results."""
    return (
        (
            f" | turns {m['turns_mean']:.2f}, env p50 {m['env_step_s_p50'] * 1000:.0f}ms, "
            f"failed episodes {m.get('episodes_failed', 0):.0f}"
            if "turns_mean" in m
            else ""
        )
        + (f" | failed groups {m['failed']:.0f}" if m.get("failed") else "")
        + (f" | dropped stale {m['dropped_stale']:.0f} groups" if m.get("dropped_stale") else "")
        + "".join(f" | {k} {v:.3f}" for k, v in m.items() if k.startswith(("eval/pass@", "eval/mean@", "eval/maj@")))
        + (f" (eval at step {m['eval/step']})" if "eval/step" in m else "")
    )


def step_line(m: dict, total_steps: int, verbose: bool = False, eta: float | None = None) -> str:
    """One metrics.jsonl row as the console's step line; pure. The default line: reward, the
    optimisation, the share without signal, staleness, trained tokens/s, elapsed and ETA; `verbose`
    (`up --verbose`, and always RUN_DIR/logs/steps.log) adds samples, tokens, the trainer's wait and
    train time, MFU, and the generators' rate and busy share."""
    tps = m["tokens"] / max(1e-9, m.get("train_s", 0) + m.get("wait_s", 0))
    optim = optim_part(m)
    frac = m.get("zero_variance_frac")
    head = (
        f"step {m['step']:>4}/{total_steps} | reward {m['reward_mean']:.3f}"
        + (f" | {optim}" if optim else "")
        + (f" | no signal {frac:.0%} of groups" if frac else "")
    )
    clock = f"elapsed {duration(m['time_s'])}" + (f", ETA {duration(eta)}" if eta is not None else "")
    if not verbose:
        return head + f" | staleness {m['staleness_max']} | {tps:,.0f} trained tok/s | {clock}" + _tail_parts(m)
    return (
        head + f" | staleness max {m['staleness_max']} | {m['samples']} samples, {m['tokens']} tokens "
        f"({tps:,.0f} tok/s) | trainer wait {m['wait_s']:.2f}s train {m['train_s']:.2f}s"
        + (f" mfu {m['mfu']:.1%}" if isinstance(m.get("mfu"), (int, float)) else "")
        + (
            f" | generators {m['gen_tokens_per_s']:,.0f} tok/s"
            if isinstance(m.get("gen_tokens_per_s"), (int, float))
            else ""
        )
        + (f", busy {m['gen_busy']:.0%} of the time" if isinstance(m.get("gen_busy"), (int, float)) else "")
        + f" | {clock}"
        + _tail_parts(m)
    )


def first_step_line(seconds: float) -> str:
    """What the console says once the first step is in: the job's start-up cost as a user sees it; pure."""
    return f"first step {seconds:.1f}s after the command (start-up: pre-flight, broker, roles, first batch)"


class Progress:
    def __init__(
        self,
        total_steps: int,
        say,
        after_step: int = 0,
        no_signal_steps: int = NO_SIGNAL_STEPS,
        started_at: float | None = None,
        verbose: bool = False,
        log_path: Path | None = None,
    ):
        """`started_at`: when the command started (time.time()); the first step shown is timed from it.
        `verbose`: the full step line on the console; `log_path`: a file that gets the full line of every
        step whatever `verbose` says (RUN_DIR/logs/steps.log)."""
        self.total = total_steps
        self.say = say
        self.started_at = started_at
        self.verbose = verbose
        self.log_path = log_path
        self.first_step_s: float | None = None
        """Command -> the first step of this job seen (None: none yet): summary.json's first_step_s."""
        self.shown = after_step
        """The last step printed: rows at or below it (a resumed run's earlier steps) are not new."""
        self.no_signal_steps = no_signal_steps
        self._silent = 0
        """Consecutive steps without a group that had a signal."""
        self._pace_from: dict | None = None
        """The first row shown: the ETA's pace is measured from it (start-up left out)."""

    def _log(self, line: str) -> None:
        if self.log_path is not None:
            with open(self.log_path, "a") as fh:
                fh.write(line + "\n")

    def show(self, rows: list[dict]) -> None:
        for m in rows:
            if m["step"] <= self.shown:
                continue
            self._pace_from = self._pace_from or m
            eta = eta_s(self._pace_from, m, self.total)
            full = step_line(m, self.total, verbose=True, eta=eta)
            self._log(full)
            self.say(full if self.verbose else step_line(m, self.total, eta=eta))
            if self.first_step_s is None and self.started_at is not None:
                self.first_step_s = round(time.time() - self.started_at, 2)
                self.say(first_step_line(self.first_step_s))
            self.shown = m["step"]
            self._silent = self._silent + 1 if m.get("zero_variance_frac") == 1.0 else 0
            if self._silent == self.no_signal_steps:  # once per silent stretch
                self.say(f"warning: no learning signal for {self._silent} steps (to step {m['step']}): {NO_SIGNAL_FIX}")
