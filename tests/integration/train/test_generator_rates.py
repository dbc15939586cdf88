"""The trainer's per-step view of the generators (streamrl/train/generator_rates.py): decode rate from
two heartbeats of each generator, summed over the live ones, and their mean busy share, against a
real redis-server.

    pytest tests/integration/train/test_generator_rates.py -q
"""

from __future__ import annotations

import json

import pytest

from streamrl.core.broker import Keys
from streamrl.train.generator_rates import GeneratorRates

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


async def _beat(broker, keys, worker: str, ts: float, tokens: int, busy: float) -> None:
    beat = {"pid": 1, "ts": ts, "tokens_generated": tokens, "busy_fraction": busy}
    await broker.set(keys.worker("generator", worker), json.dumps(beat), ttl_s=30)


async def test_rates_come_from_heartbeat_differences_and_gone_generators_stop_counting(config, broker):
    keys = Keys(config.run.name)
    rates = GeneratorRates(broker, keys)
    assert await rates.sample() == {}  # no generator yet
    await _beat(broker, keys, "gen-0", 100.0, 1000, 0.5)
    await _beat(broker, keys, "gen-1", 100.0, 0, 0.7)
    assert await rates.sample() == {"gen_busy": 0.6}  # one heartbeat each: no rate yet
    await _beat(broker, keys, "gen-0", 105.0, 6000, 0.9)  # 1,000 tok/s
    assert await rates.sample() == {"gen_tokens_per_s": 1000.0, "gen_busy": 0.8}
    await _beat(broker, keys, "gen-1", 102.0, 4000, 0.7)  # 2,000 tok/s; gen-0 unchanged keeps its rate
    assert await rates.sample() == {"gen_tokens_per_s": 3000.0, "gen_busy": 0.8}
    await broker.delete(keys.worker("generator", "gen-0"))
    assert await rates.sample() == {"gen_tokens_per_s": 2000.0, "gen_busy": 0.7}


async def test_heartbeats_that_are_not_a_generators_are_skipped(config, broker):
    keys = Keys(config.run.name)
    rates = GeneratorRates(broker, keys)
    await broker.set(keys.worker("generator", "junk"), "not json", ttl_s=30)
    await broker.set(keys.worker("generator", "list"), "[1, 2]", ttl_s=30)
    await broker.set(keys.worker("generator", "text"), json.dumps({"ts": "soon", "tokens_generated": 5}), ttl_s=30)
    await _beat(broker, keys, "gen-0", 100.0, 0, 0.5)
    assert await rates.sample() == {"gen_busy": 0.5}
    await _beat(broker, keys, "gen-0", 101.0, 500, 0.5)
    assert await rates.sample() == {"gen_tokens_per_s": 500.0, "gen_busy": 0.5}
