"""vLLM ranks every sampled token (its place among the vocabulary's log-probs) through a
torch.compile'd function, `batched_count_greater_than`. On the CPU build the first request of every
engine process pays for that compile: dynamo tracing, four `python -c` probes of the CPU's vector
ISA and an inductor C++ build, about 3 s with warm caches and 15 s cold on 2 cores, on the path to a
job's first step (and every generator restart's). streamrl never reads the ranks (a rollout keeps the
sampled token's log-prob), so with generator.cpu_eager_token_ranks (off by default: see its doc in
streamrl/config/rollout.py) the CPU generator ranks eagerly: the same count, one transient bool
tensor of the logits' shape, no compile.

The swap is made in the generator's process before the engine starts; the EngineCore (forked, or
in-process) inherits it. A spawned EngineCore, or a vLLM without the function, keeps vLLM's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def count_greater_or_equal(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """vLLM's `batched_count_greater_than`, uncompiled: per row, how many of `x` are >= `values`."""
    return (x >= values).sum(-1)


def use_eager_token_ranks() -> bool:
    """Make vLLM's sampler rank tokens with count_greater_or_equal; False where this vLLM has no such
    function (nothing changed)."""
    try:
        from vllm.v1.sample import sampler
    except ImportError:
        return False
    if not hasattr(sampler, "batched_count_greater_than"):
        return False
    sampler.batched_count_greater_than = count_greater_or_equal
    return True
