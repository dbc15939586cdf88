"""The requests running on a generator's engine right now: how many (the generator's busy time), the
deltas delivered to them, and the token stream of each single-turn one.

A weight switch reads all three (streamrl/generate/weight_follower.py): it waits until no delta is
being delivered, marks in each registered stream where the new weights start, and logs how many
requests it paused. Every request a generator runs, a group's sample or an episode's model turn,
runs inside `running`:

    requests = RunningRequests(on_change=update_stats)    # called as each request starts and ends
    with requests.running(request_id, SampleStream(pin.version)) as stream:
        async for delta in engine.stream(...): requests.delivered(); stream.add(...)
    requests.busy_fraction()       # share of the time since start with a request running
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from streamrl.generate.sample_stream import SampleStream


class RunningRequests:
    def __init__(self, on_change: Callable[[], None] | None = None) -> None:
        self.active = 0
        """Requests running now (single-turn samples and episode model turns)."""
        self.deliveries = 0
        """Deltas delivered to request consumers so far: a switch waits until this stops moving."""
        self.streams: dict[str, SampleStream] = {}
        """The running single-turn requests' token streams by request id: a full-weights switch marks each."""
        self._started = time.monotonic()
        self._busy_since = 0.0
        self._busy_s = 0.0
        self._on_change = on_change or (lambda: None)

    @contextlib.contextmanager
    def running(self, request_id: str, stream: SampleStream | None = None) -> Iterator[SampleStream | None]:
        """Count one request as running for the block; `stream` (registered under `request_id`) is
        marked by a full-weights switch while it runs. Register it in the same step as its first
        version is read (no await in between), so no switch falls between the two."""
        self._add(+1)
        if stream is not None:
            self.streams[request_id] = stream
        try:
            yield stream
        finally:
            self.streams.pop(request_id, None)
            self._add(-1)

    def delivered(self) -> None:
        self.deliveries += 1

    def tokens_made(self, engine) -> int:
        """Tokens the running single-turn requests have made, delivered or still held in `engine` (a
        VLLMEngine): progress that, unlike `deliveries`, moves while requests hold their tokens back
        (generator.stream_interval 0)."""
        return sum(engine.generated_tokens(rid) or len(s.token_ids) for rid, s in self.streams.items())

    def busy_fraction(self) -> float:
        """Share of the time since this object was made with at least one request running."""
        now = time.monotonic()
        busy = self._busy_s + (now - self._busy_since if self.active > 0 else 0.0)
        return round(min(busy / max(now - self._started, 1e-9), 1.0), 4)

    def _add(self, delta: int) -> None:
        now = time.monotonic()
        if self.active > 0:
            self._busy_s += now - self._busy_since
        self._busy_since = now
        self.active += delta
        self._on_change()
