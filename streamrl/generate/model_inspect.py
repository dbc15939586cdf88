"""vLLM's model-class inspection in this process instead of a fresh interpreter.

The first time vLLM meets a model class on a machine it inspects it (which interfaces the class
supports: LoRA, pooling, multimodal, ...) in a new Python subprocess, then caches the answer under
VLLM_CACHE_ROOT/modelinfos. That subprocess imports vLLM, torch and the model's module from scratch:
21 s of the 0.6B job's 130 s from command to first step on a fresh H100
(docs/benchmarks/gpu-round9_h100_2026-12-07.md). The generator imports vLLM anyway, so the class is
inspected here; the EngineCore forked afterwards inherits the imported module. vLLM runs the
inspection elsewhere so that CUDA is not initialised in the calling process; importing a model class
does not initialise it, and where something did, vLLM starts its EngineCore by spawn instead of fork
(and streamrl's auto-fork retries with spawn), so the start stays correct, only slower.

    with models_inspected_here():
        vllm_config = engine_args.create_engine_config()
"""

from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def models_inspected_here() -> Iterator[bool]:
    """Within the block, vLLM's registry inspects model classes in this process. Yields whether it
    does (False: a vLLM without the private hook; it keeps its subprocess)."""
    try:
        from vllm.model_executor.models import registry
    except ImportError:
        yield False
        return
    original = getattr(registry, "_run_in_subprocess", None)
    if not callable(original):
        yield False
        return
    registry._run_in_subprocess = _run_here
    try:
        yield True
    finally:
        registry._run_in_subprocess = original


def _run_here(fn):
    return fn()
