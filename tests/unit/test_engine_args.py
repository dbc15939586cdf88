"""Generator settings that become vLLM engine/request arguments: the fixed KV-cache size
(generator.kv_cache_memory_gb) and where the completion text is decoded (generator.detokenize);
tests/integration/generator/test_vllm_long_prompts.py runs both on the real CPU engine."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from streamrl.config.schema import GeneratorConfig
from streamrl.generate.vllm_engine import VLLMEngine, kv_cache_args


def test_kv_cache_size_is_fixed_on_a_gpu_only():
    gen = GeneratorConfig(kv_cache_memory_gb=16)
    assert kv_cache_args(gen, cpu=False) == {"kv_cache_memory_bytes": 16 * 2**30}
    assert kv_cache_args(gen, cpu=True) == {}  # the CPU build sizes its cache by cpu_kvcache_gb
    assert kv_cache_args(GeneratorConfig(), cpu=False) == {}  # None: vLLM's memory profile
    with pytest.raises(ValidationError):
        GeneratorConfig(kv_cache_memory_gb=0)


def test_detokenize_setting_reaches_the_request():
    for mode, vllm_detokenizes in (("end", False), ("incremental", True)):
        engine = VLLMEngine("unused", GeneratorConfig(detokenize=mode), dtype="float32", seed=0)
        params = engine.sampling_params(seed=1)
        assert params.detokenize is vllm_detokenizes and params.flat_logprobs and params.logprobs == 0
    with pytest.raises(ValidationError):
        GeneratorConfig(detokenize="never")
