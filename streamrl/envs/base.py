"""Python SDK for environments of multi-turn episodes: subclass `Env`, run it in env workers.

    # my_envs.py
    from streamrl.envs.base import Env

    class Echo(Env):
        def reset(self, item):            # item = {"text": prompt text, "meta": task data}
            self.meta = item["meta"]
        def step(self, action):           # action = the model's turn (text)
            return f"you said {action!r}", 0.0, False      # (observation, reward, done)

    streamrl env --fn my_envs:Echo --run tiny --broker redis://...     # or env.fn in the config

`reset` and `step` may be `async def`; sync ones run in a thread. One instance serves one
episode. An env worker that did not see an episode's earlier steps (another worker died, or
evicted its instance) rebuilds it by calling `reset(item)` and `step` on every earlier action
in order; an env whose steps cannot be replayed that way (real side effects, hidden randomness)
sets `replayable = False`, and its interrupted episodes are restarted from the prompt instead.
The wire protocol an env in another language speaks is docs/protocol.md, "Environment steps".
"""

from __future__ import annotations

import random
import time
from typing import Any

from streamrl.tasks.charclass import charclass_reward


class Env:
    replayable: bool = True
    """True when reset(item) + the same actions always rebuild the same state (deterministic)."""

    def reset(self, item: dict) -> None:
        """Start an episode for task `item` ({"text": ..., "meta": {...}})."""

    def step(self, action: str) -> tuple[str, float, bool]:
        """Apply the model's turn; return (observation text, reward of this step, done)."""
        raise NotImplementedError


class CharclassDialog(Env):
    """The tiny multi-turn task (task.name=charclass_dialog): the prompt is only "?". Whatever the
    model says first, the env answers with the character class ("\\ndigits:"); the model's second
    turn is scored like `charclass` against that class, so the reward depends on what the env said.
    Each step sleeps a random latency_ms (like a tool call); deterministic given the actions."""

    def __init__(self, latency_ms: tuple[float, float] = (20.0, 200.0)):
        self.latency_ms = latency_ms
        self.meta: dict = {}
        self.turn = 0

    def reset(self, item: dict) -> None:
        self.meta = item["meta"]
        self.turn = 0

    def step(self, action: str) -> tuple[str, float, bool]:
        low, high = self.latency_ms
        time.sleep(random.uniform(low, high) / 1000)
        self.turn += 1
        if self.turn == 1:
            return f"\n{self.meta['cls']}:", 0.0, False
        return "", charclass_reward("", action, self.meta), True


def check_step(out: Any) -> tuple[str, float, bool, dict]:
    """Validate what step() returned: (observation, reward, done) or (observation, reward, done, info);
    ValueError says what is wrong. `info` may hold `messages` (chat messages [{role, content}] the
    generator renders with the chat template, streamrl/generate/chat.py) and numeric counters (e.g.
    tool_calls) summed per episode into metrics."""
    if not (isinstance(out, tuple) and len(out) in (3, 4)):
        raise ValueError(
            f"step() must return (observation: str, reward: float, done: bool[, info: dict]), got {out!r:.100}"
        )
    obs, reward, done = out[:3]
    info = out[3] if len(out) == 4 else {}
    if not isinstance(obs, str):
        raise ValueError(f"step() returned observation {obs!r:.60}, not a str")
    try:
        reward = float(reward)
    except (TypeError, ValueError):
        raise ValueError(f"step() returned reward {reward!r:.60}, not a number") from None
    if reward != reward or reward in (float("inf"), float("-inf")):
        raise ValueError(f"step() returned reward {reward}")
    if not isinstance(done, bool):
        raise ValueError(f"step() returned done={done!r:.60}, not a bool")
    if not isinstance(info, dict):
        raise ValueError(f"step() returned info {info!r:.60}, not a dict")
    messages = info.get("messages", [])
    if not (
        isinstance(messages, list)
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        )
    ):
        raise ValueError(f"step() info['messages'] must be [{{role: str, content: str}}, ...], got {messages!r:.80}")
    counts = {k: v for k, v in info.items() if k != "messages"}
    for key, value in counts.items():
        if not (
            isinstance(key, str)
            and isinstance(value, (int, float))
            and not isinstance(value, bool)
            and value == value
            and abs(value) != float("inf")
        ):
            raise ValueError(
                f"step() info[{key!r}]={value!r:.40}: info holds `messages` and finite numeric counters only"
            )
    return obs, reward, done, {"messages": messages, "counts": counts}
