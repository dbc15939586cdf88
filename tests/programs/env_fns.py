"""Env classes the env-worker tests run (imported by module path, also by a subprocess worker)."""

import asyncio
import threading
import time

from streamrl.envs.base import Env


class Counter(Env):
    """Deterministic: the observation names every action so far, so a replay is checkable.
    meta["sleep"] seconds per step (a slow tool)."""

    def reset(self, item):
        self.sleep = float(item["meta"].get("sleep", 0))
        self.actions = []

    def step(self, action):
        time.sleep(self.sleep)
        self.actions.append(action)
        return f"{len(self.actions)}:{'|'.join(self.actions)}", float(len(action)), action == "stop"


class AsyncCounter(Counter):
    async def reset(self, item):
        super().reset(item)

    async def step(self, action):
        await asyncio.sleep(self.sleep)
        self.actions.append(action)
        return f"{len(self.actions)}:{'|'.join(self.actions)}", float(len(action)), action == "stop"


class OneShot(Counter):
    """Holds state a replay cannot rebuild (e.g. a remote session)."""

    replayable = False


class Misbehave(Env):
    def reset(self, item):
        pass

    def step(self, action):
        if action == "hang":
            time.sleep(3)
        if action == "forever":  # a call that never returns (a wedged tool)
            threading.Event().wait()
        if action == "raise":
            raise RuntimeError("tool crashed")
        if action == "garbage":
            return {"not": "a tuple"}
        if action == "nan":
            return "x", float("nan"), False
        return "ok", 1.0, False


class FlakyDialog(Env):
    """The charclass dialog whose second step raises when the model's first turn starts with a
    digit (about one episode in ten early on): env errors must fail only those episodes."""

    def reset(self, item):
        from streamrl.envs.base import CharclassDialog

        self.inner = CharclassDialog(latency_ms=(1.0, 5.0))
        self.inner.reset(item)
        self.first = None

    def step(self, action):
        if self.first is None:
            self.first = action
        elif self.first[:1].isdigit():
            raise RuntimeError("flaky tool crashed")
        return self.inner.step(action)


class SlowAfterFirst(Env):
    """Not replayable; its first step answers at once, later ones sleep meta["sleep_after_first"]
    seconds (a long tool call, so the worker can be killed mid-step). Observations: "\\n<k>:"."""

    replayable = False

    def reset(self, item):
        self.sleep = float(item["meta"].get("sleep_after_first", 0))
        self.n = 0

    def step(self, action):
        self.n += 1
        if self.n > 1:
            time.sleep(self.sleep)
        return f"\n{self.n}:", float(len(action)), False


class Hang(Env):
    """A wedged env: reset returns, every step waits forever (a tool call that never comes back)."""

    def reset(self, item):
        pass

    def step(self, action):
        threading.Event().wait()
