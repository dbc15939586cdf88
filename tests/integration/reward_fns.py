"""Reward functions with bad behaviour, for tests/integration/test_reward_worker.py."""

import time


def misbehave(prompt: str, completion: str, meta: dict) -> float:
    if completion == "hang":
        time.sleep(30)
    if completion == "raise":
        raise ValueError("boom")
    if completion == "nan":
        return float("nan")
    return len(completion) / 10
