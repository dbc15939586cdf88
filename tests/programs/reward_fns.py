"""Reward functions with bad behaviour, for tests (reward worker, reward failures, `streamrl up` e2e)."""

import time


def misbehave(prompt: str, completion: str, meta: dict) -> float:
    if completion == "hang":
        time.sleep(30)
    if completion == "raise":
        raise ValueError("boom")
    if completion == "nan":
        return float("nan")
    return len(completion) / 10


def always_raise(prompt: str, completion: str, meta: dict) -> float:
    raise ValueError("grader unavailable")


def always_nan(prompt: str, completion: str, meta: dict) -> float:
    return float("nan")


def raise_or_nan(prompt: str, completion: str, meta: dict) -> float:
    """Fails on every completion, two ways (by a hash of the text): always_raise's error or always_nan's NaN."""
    import zlib

    if zlib.crc32(completion.encode()) % 2 == 0:
        raise ValueError("grader unavailable")
    return float("nan")


def fail_one_in_five(prompt: str, completion: str, meta: dict) -> float:
    """Raises on ~20% of completions (deterministically, by a hash of the text), else charclass."""
    import zlib

    from streamrl.tasks.charclass import charclass_reward

    if zlib.crc32(completion.encode()) % 5 == 0:
        raise RuntimeError("flaky grader")
    return charclass_reward(prompt, completion, meta)
