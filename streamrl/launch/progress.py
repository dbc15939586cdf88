"""The console's view of training: one line per trainer step from RUN_DIR/metrics.jsonl, and a
warning when the job has stopped learning (streamrl up; streamrl/launch/supervisor.py).

    p = Progress(total_steps=20, say=print, after_step=8)   # a resumed run: steps 1..8 were shown before
    p.show(read_metrics(run_dir))                           # prints the rows above what it printed

    step    9/20 | reward 0.250 | loss 0.012 kl 0.0031 ent 1.42 gnorm 0.87 | no signal 2/4 groups | ...
"""

from __future__ import annotations

import time

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


def step_line(m: dict, total_steps: int) -> str:
    """One metrics.jsonl row as the console's step line; pure."""
    tps = m["tokens"] / max(1e-9, m.get("train_s", 0) + m.get("wait_s", 0))
    optim = optim_part(m)
    frac = m.get("zero_variance_frac")
    return (
        f"step {m['step']:>4}/{total_steps} | reward {m['reward_mean']:.3f}"
        + (f" | {optim}" if optim else "")
        + (f" | no signal {frac:.0%} of groups" if frac else "")
        + f" | staleness max {m['staleness_max']} | {m['samples']} samples, {m['tokens']} tokens "
        f"({tps:,.0f} tok/s) | wait {m['wait_s']:.2f}s train {m['train_s']:.2f}s"
        + (f" mfu {m['mfu']:.1%}" if isinstance(m.get("mfu"), (int, float)) else "")
        + (f" | gen {m['gen_tokens_per_s']:,.0f} tok/s" if isinstance(m.get("gen_tokens_per_s"), (int, float)) else "")
        + (f" busy {m['gen_busy']:.0%}" if isinstance(m.get("gen_busy"), (int, float)) else "")
        + f" | t={m['time_s']:.0f}s"
        + (
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
    ):
        """`started_at`: when the command started (time.time()); the first step shown is timed from it."""
        self.total = total_steps
        self.say = say
        self.started_at = started_at
        self.first_step_s: float | None = None
        """Command -> the first step of this job seen (None: none yet): summary.json's first_step_s."""
        self.shown = after_step
        """The last step printed: rows at or below it (a resumed run's earlier steps) are not new."""
        self.no_signal_steps = no_signal_steps
        self._silent = 0
        """Consecutive steps without a group that had a signal."""

    def show(self, rows: list[dict]) -> None:
        for m in rows:
            if m["step"] <= self.shown:
                continue
            self.say(step_line(m, self.total))
            if self.first_step_s is None and self.started_at is not None:
                self.first_step_s = round(time.time() - self.started_at, 2)
                self.say(first_step_line(self.first_step_s))
            self.shown = m["step"]
            self._silent = self._silent + 1 if m.get("zero_variance_frac") == 1.0 else 0
            if self._silent == self.no_signal_steps:  # once per silent stretch
                self.say(f"warning: no learning signal for {self._silent} steps (to step {m['step']}): {NO_SIGNAL_FIX}")
