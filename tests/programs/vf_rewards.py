"""A reward plugged into a verifiers task through verifiers' own config (TaskConfig.rewards)."""

import re


async def bracketed(trace) -> float:
    """The share of the model's turns that are exactly one [move]: a format reward."""
    replies = [m.content or "" for m in trace.assistant_messages]
    return sum(bool(re.fullmatch(r"\[\w+\]", r.strip())) for r in replies) / max(len(replies), 1)


async def needs_a_box(trace, runtime) -> float:
    """A reward that reads the sandbox: streamrl runs none, so such a task is refused."""
    return 0.0
