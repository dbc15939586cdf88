"""The eager token ranks the CPU generator gives vLLM's sampler (streamrl/generate/eager_ranks.py) are
vLLM's own definition, and the swap reaches the sampler module vLLM calls them through.

    pytest tests/unit/test_eager_ranks.py
"""

from __future__ import annotations

import torch

from streamrl.generate.eager_ranks import count_greater_or_equal, use_eager_token_ranks


def test_eager_ranks_equal_vllms_definition_ties_included():
    from vllm.v1.sample.ops.logprobs import batched_count_greater_than

    vllms = batched_count_greater_than._torchdynamo_orig_callable  # its Python body, without the compile
    x = torch.randn(5, 97).log_softmax(-1)
    x[2, 10:20] = x[2, 3]  # ties: a tied token counts as ranked above
    values = torch.stack([x[0, 0], x[1, 96], x[2, 3], x[3].max(), x[4].min()]).unsqueeze(-1)
    got = count_greater_or_equal(x, values)
    assert torch.equal(got, vllms(x, values))
    assert got.tolist()[2:] == [int((x[2] >= x[2, 3]).sum()), 1, 97]


def test_the_sampler_calls_the_eager_ranks_after_the_swap(monkeypatch):
    from vllm.v1.sample import sampler

    monkeypatch.setattr(sampler, "batched_count_greater_than", sampler.batched_count_greater_than)  # restored after
    assert use_eager_token_ranks()
    assert sampler.batched_count_greater_than is count_greater_or_equal
