"""bench/trainer_profile.py's GPU side, which the CPU machines cannot profile: real kernel names of an
H100/H200 trainer step map to their categories, and a CUDA kernel is attributed through the op whose
correlation id it carries (torch.profiler FunctionEvents built as the profiler builds them).

    pytest tests/unit/test_trainer_profile.py
"""

from __future__ import annotations

import pytest
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from bench.trainer_profile import CATEGORIES, breakdown, categorize

ADAM = "Optimizer.step#AdamW.step"
CHUNKED = "_ChunkedLogprobs"
CHUNKED_BW = "autograd::engine::evaluate_function: _ChunkedLogprobsBackward"


@pytest.mark.parametrize(
    "kernel, launcher, ancestors, category",
    [
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "aten::mm", ["aten::matmul", "aten::linear"], "gemm"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "aten::addmm", [], "gemm"),
        # The LM head's matmul inside the chunked log-prob path is still a matmul.
        ("nvjet_tst_192x192_64x4_2x1_v_bz_TNT", "aten::mm", [CHUNKED], "gemm"),
        (
            "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>",
            "aten::_flash_attention_forward",
            [],
            "attention",
        ),
        ("fmha_cutlassB_bf16_aligned_64x64_k128_sm80", "aten::_efficient_attention_backward", [], "attention"),
        ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "Torch-Compiled Region: 0/0", [], "norm_elementwise"),
        ("triton_poi_fused_mul_silu_1", None, [], "norm_elementwise"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::exp_kernel_cuda>",
            "aten::exp",
            [CHUNKED],
            "logsoftmax_loss",
        ),
        (
            "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, LogSumExp>>",
            "aten::logsumexp",
            [],
            "logsoftmax_loss",
        ),
        ("void at::native::scatter_add_kernel", "aten::scatter_add_", [CHUNKED_BW], "logsoftmax_loss"),
        (
            "void at::native::multi_tensor_apply_kernel<TensorListMetadata<4>, FusedAdamMathFunctor>",
            "aten::_foreach_mul_",
            [ADAM],
            "optimizer",
        ),
        (
            "void at::native::lpnorm_cleanup<float, NormType::L2>",
            "aten::_foreach_norm",
            ["clip_grad_norm_"],
            "optimizer",
        ),
        ("Memcpy HtoD (Pageable -> Device)", "aten::copy_", ["aten::_to_copy", "aten::to"], "copies"),
        (
            "void at::native::elementwise_kernel<128, 4, direct_copy_kernel_cuda>",
            "aten::copy_",
            ["aten::_to_copy"],
            "copies",
        ),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "nccl:all_reduce", [], "communication"),
        (
            "void at::native::(anonymous namespace)::chunk_cat_cuda_kernel",
            "aten::_chunk_cat",
            ["FSDP::post_backward_reduce (layers.0)"],
            "communication",
        ),
        (
            "void at::native::elementwise_kernel<copy>",
            "aten::copy_",
            ["FSDP::all_gather_copy_out (layers.3)"],
            "communication",
        ),
        ("triton_tem_fused_0", "triton_tem_fused_0", ["Torch-Compiled Region: 0/0"], "attention"),
        ("triton_tem_fused_mm_3", None, [], "gemm"),
        (
            "cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x128_4x1x1",
            "aten::_scaled_dot_product_cudnn_attention",
            [],
            "attention",
        ),
        ("void at::native::indexing_backward_kernel<float>", "aten::index_put_", [], "other"),
    ],
)
def test_kernel_categories(kernel, launcher, ancestors, category):
    assert categorize(kernel, launcher, ancestors) == category


def _event(id_: int, name: str, start: float, end: float, device=DeviceType.CPU, linked: int = 0, parent=None):
    e = FunctionEvent(id_, name, 1, start, end, device_type=device, linked_correlation_id=linked)
    if parent is not None:
        e.set_cpu_parent(parent)
        parent.append_cpu_child(e)
    return e


def test_cuda_kernels_attributed_through_their_ops():
    step = _event(1, "Optimizer.step#AdamW.step", 0, 900)
    foreach = _event(2, "aten::_foreach_add_", 10, 20, parent=step)
    mm = _event(3, "aten::mm", 30, 40)
    events = [
        step,
        foreach,
        mm,
        # A kernel's linked correlation id names the op that launched it.
        _event(10, "void at::native::multi_tensor_apply_kernel<...>", 100, 300, DeviceType.CUDA, linked=2),
        _event(11, "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", 250, 500, DeviceType.CUDA, linked=3),
        _event(12, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 600, 700, DeviceType.CUDA, linked=99),  # no op found
    ]
    b = breakdown(events, 1e-3, "cuda")  # a 1 ms step
    assert set(b["categories"]) == set(CATEGORIES)
    assert b["categories"]["optimizer"] == pytest.approx(0.2)
    assert b["categories"]["gemm"] == pytest.approx(0.25)
    assert b["categories"]["communication"] == pytest.approx(0.1)
    assert b["kernel_ms"] == pytest.approx(0.55) and b["kernels"] == 3
    assert b["busy_ms"] == pytest.approx(0.5)  # 100-500 (two overlapping kernels) + 600-700
    assert b["idle_ms"] == pytest.approx(0.5) and b["percent_of_step"]["idle"] == pytest.approx(50.0)


def test_cuda_kernels_attributed_without_correlation_ids():
    """torch <= 2.11 (the H200's): FunctionEvent has no linked_correlation_id; the profiler appended
    each kernel to the op that launched it, and the breakdown must come out the same."""
    step = _event(1, ADAM, 0, 900)
    foreach = _event(2, "aten::_foreach_add_", 10, 20, parent=step)
    mm = _event(3, "aten::mm", 30, 40)
    adam_kernel = _event(10, "void at::native::multi_tensor_apply_kernel<...>", 100, 300, DeviceType.CUDA)
    gemm = _event(11, "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", 250, 500, DeviceType.CUDA)
    nccl = _event(12, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 600, 700, DeviceType.CUDA)  # no op found
    foreach.append_kernel(adam_kernel.name, 0, 200)
    mm.append_kernel(gemm.name, 0, 250)
    events = [step, foreach, mm, adam_kernel, gemm, nccl]
    for e in events:
        del e.linked_correlation_id
    b = breakdown(events, 1e-3, "cuda")
    assert b["categories"]["optimizer"] == pytest.approx(0.2)
    assert b["categories"]["gemm"] == pytest.approx(0.25)
    assert b["categories"]["communication"] == pytest.approx(0.1)
    assert b["kernels"] == 3 and b["busy_ms"] == pytest.approx(0.5)
