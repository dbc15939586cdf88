"""A job where nothing can be trained stops, saying why: the assembler counts the groups that failed in a row.

streak = FailureStreak(cfg)              # in the assembler
streak.failed("reward: reward function raised ValueError: boom")   # FatalError once the bound is hit
streak.ok()                              # a group completed with usable annotations
"""

from __future__ import annotations

from streamrl.config.schema import Config
from streamrl.core.errors import FatalError


class FailureStreak:
    """Groups that failed in a row; past rollout.max_consecutive_failed_groups the job cannot train."""

    def __init__(self, cfg: Config):
        self.bound = cfg.rollout.max_consecutive_failed_groups
        self.reward_fn = cfg.reward.fn
        self.on_error = cfg.reward.on_error
        self.count = 0
        self.first = ""
        """The error of the streak's first group (what to show: later ones are usually the same)."""

    def ok(self) -> None:
        self.count, self.first = 0, ""

    def failed(self, reason: str) -> None:
        self.count += 1
        self.first = self.first or reason
        if self.bound is not None and self.count >= self.bound:
            raise FatalError(self.message())

    def message(self) -> str:
        fix = (
            f"fix the reward function (reward.fn={self.reward_fn})"
            if self.first.startswith("reward")
            else "fix what the error names"
        )
        alt = (
            ""
            if self.on_error == "score"
            else "; or set reward.on_error=score to train failing rollouts with reward.error_value"
        )
        return (
            f"nothing can be trained: {self.count} groups in a row failed "
            f"(rollout.max_consecutive_failed_groups={self.bound}); the first one: {self.first}. "
            f"To go on, {fix}{alt}"
        )
