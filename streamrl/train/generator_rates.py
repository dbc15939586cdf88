"""The generators' decode rate and busy share as the trainer logs them with each step.

Each generator's heartbeat (streamrl/core/worker.py) carries its running `tokens_generated` count,
its `busy_fraction` and the time `ts` it was written; between two heartbeats of one generator the
rate is the tokens' difference over the times' difference. The trainer samples the heartbeats once a
step (one SCAN and a GET per generator), so a step row says how fast generation went beside how long
the trainer waited for it:

    rates = GeneratorRates(broker, keys)
    row.update(await rates.sample())   # {"gen_tokens_per_s": 11200.0, "gen_busy": 0.93} (once two heartbeats differ)
"""

from __future__ import annotations

import json

from streamrl.core.broker import Broker, Keys


class GeneratorRates:
    def __init__(self, broker: Broker, keys: Keys):
        self.broker, self.keys = broker, keys
        self._last: dict[str, tuple[float, float]] = {}
        """generator key -> (ts, tokens_generated) of the newest heartbeat seen."""
        self._rates: dict[str, float] = {}

    async def sample(self) -> dict[str, float]:
        """{"gen_tokens_per_s": sum over live generators, "gen_busy": their mean busy_fraction};
        keys left out until known (no generator yet, or no heartbeat written since the last one)."""
        busy, live = [], set()
        for key in await self.broker.scan(self.keys.worker("generator", "*")):
            raw = await self.broker.get(key)
            if raw is None:
                continue  # its heartbeat expired between the scan and the read
            try:  # a heartbeat is any process's write: one that is not ours is skipped, not fatal
                beat = json.loads(raw)
                ts, tokens = float(beat.get("ts", 0.0)), float(beat.get("tokens_generated", 0.0))
                busy_fraction = float(beat["busy_fraction"]) if "busy_fraction" in beat else None
            except (ValueError, TypeError, AttributeError):
                continue
            live.add(key)
            before = self._last.get(key)
            if before is not None and ts > before[0] and tokens >= before[1]:
                self._rates[key] = (tokens - before[1]) / (ts - before[0])
            if before is None or ts > before[0]:
                self._last[key] = (ts, tokens)
            if busy_fraction is not None:
                busy.append(busy_fraction)
        for gone in set(self._rates) - live:  # a generator that left stops counting
            self._rates.pop(gone)
            self._last.pop(gone, None)
        out = {}
        if self._rates:
            out["gen_tokens_per_s"] = round(sum(self._rates.values()), 1)
        if busy:
            out["gen_busy"] = round(sum(busy) / len(busy), 4)
        return out
