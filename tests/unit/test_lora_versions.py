"""Which LoRA adapter versions a generator keeps in vLLM: the newest max_loras, plus any a request still runs on.

pytest tests/unit/test_lora_versions.py
"""

from __future__ import annotations

import pytest

from streamrl.config.schema import Config, GeneratorConfig, RolloutConfig
from streamrl.core.errors import ConfigError
from streamrl.generate.lora_versions import LoraVersions, max_loras, vllm_lora_rank


def test_requests_pin_the_newest_version_and_keep_it_loaded_until_they_end():
    versions = LoraVersions(keep=2)
    with versions.pin() as base:
        assert (base.version, base.request) == (0, None)  # before any adapter: the base model
    assert versions.added(1, "A1") == []
    with versions.pin() as on_v1:
        assert (on_v1.version, on_v1.request) == (1, "A1")
        assert versions.added(2, "A2") == []
        assert versions.added(3, "A3") == []  # version 1 is outside the window but still running
        with versions.pin() as on_v3:
            assert (on_v3.version, on_v3.request) == (3, "A3")
        assert sorted(versions.loaded) == [1, 2, 3]
    assert versions.removable() == ["A1"]  # its last request ended
    assert versions.added(4, "A4") == ["A2"]
    assert sorted(versions.loaded) == [3, 4] and not versions.users


def test_max_loras_and_vllm_rank():
    cfg = Config()
    assert max_loras(cfg.model_copy(update={"rollout": RolloutConfig(max_staleness=3)})) == 4
    assert max_loras(cfg.model_copy(update={"generator": GeneratorConfig(max_loras=6)})) == 6
    assert [vllm_lora_rank(r) for r in (1, 4, 8, 9, 320, 512)] == [1, 8, 8, 16, 320, 512]
    with pytest.raises(ConfigError, match="trainer.lora.rank <= 512"):
        vllm_lora_rank(513)
