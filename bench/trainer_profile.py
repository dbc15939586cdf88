"""Where one trainer step's time goes: a torch.profiler trace grouped into kernel categories.

Used by `bench trainer_mfu --profile` (bench/trainer_mfu.py): one step runs under the profiler, the
chrome trace is kept, and every kernel (CUDA kernels and memcpy/memset on a GPU; on CPU, the self
time of each aten op) is put in one category by its name and the ops that launched it:

    gemm             matmuls (cuBLAS/CUTLASS kernels, aten::mm/addmm/bmm), the LM head's included
    attention        SDPA / flash / memory-efficient / cuDNN / flex attention (inductor's triton_tem_
                     template kernels)
    logsoftmax_loss  the log-prob path's non-matmul kernels (chunked logsumexp/gather/scatter or
                     log_softmax) and its backward
    norm_elementwise RMSNorm, SiLU, residual adds, compiled (triton/inductor) fused kernels, casts
                     fused into them
    optimizer        AdamW (foreach), gradient-norm clipping
    copies           memcpy/memset, copy_/to-dtype kernels outside compiled code
    communication    NCCL / gloo collectives, and FSDP2's all-gather / reduce-scatter copy-in and
                     copy-out kernels (its cast of the parameters to the compute dtype included)
    other            anything the rules above do not name, e.g. the embedding's gather and its
                     index_put backward (shown so nothing is silently dropped)

kernel_ms is the sum of every kernel's duration (the categories add up to it); busy_ms the time at
least one kernel ran (kernels on other streams can overlap); idle_ms = step wall time - busy_ms, the
device waiting for the CPU (launch overhead, Python, host syncs). On CPU, time the profiler does not see
as an aten op (inductor's fused C++ kernels, Python) counts as idle: the CPU run checks the code path,
the GPU run gives the numbers.

    rows = breakdown(prof.events(), step_s, "cuda")   # {"categories": {...}, "kernel_ms": ...}
"""

from __future__ import annotations

import functools

CATEGORIES = (
    "gemm",
    "attention",
    "logsoftmax_loss",
    "norm_elementwise",
    "optimizer",
    "copies",
    "communication",
    "other",
)

# Substrings (lower case) of a kernel's or op's name; the first category whose rule matches wins.
# FSDP2's all-gather and reduce-scatter regions include their copy-in/out kernels (and the cast of
# the float32 parameters to the compute dtype): the cost of sharding, counted with the collectives.
_COMM = (
    "nccl",
    "gloo",
    "c10d::",
    "record_param_comms",
    "allreduce",
    "all_gather",
    "reduce_scatter",
    "post_backward_reduce",
    "post_backward_rs_wait",
)
_ATTN = ("flash", "fmha", "attention", "sdpa", "flex")
_GEMM_KERNEL = ("gemm", "nvjet", "cutlass", "xmma", "cublas", "s16816", "wgmma", "splitk")
_GEMM_OP = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear", "aten::_scaled_mm")
_OPTIM = ("optimizer.step", "_foreach", "multi_tensor_apply", "clip_grad", "adam")
_LOGPROB_REGION = ("_chunkedlogprobs", "log_softmax", "logsumexp", "nll_loss", "cross_entropy")
_COPY = ("memcpy", "memset", "aten::copy_", "aten::_to_copy", "aten::to", "aten::clone", "aten::contiguous")
_ELEMENTWISE = (
    "triton",
    "cpp_fused",
    "compiledfunction",
    "elementwise",
    "vectorized",
    "reduce",
    "norm",
    "silu",
    "gelu",
    "sigmoid",
    "softmax",
    "aten::add",
    "aten::mul",
    "aten::sub",
    "aten::div",
    "aten::pow",
    "aten::rsqrt",
    "aten::mean",
    "aten::sum",
    "aten::exp",
    "aten::neg",
    "aten::cat",
    "aten::where",
    "aten::clamp",
    "aten::minimum",
    "aten::maximum",
    "aten::fill_",
    "aten::zero_",
    "aten::masked_fill",
)


def _has(names: list[str], needles: tuple[str, ...]) -> bool:
    return any(n in name for name in names for n in needles)


def _by_name(names: list[str]) -> str | None:
    """The category that names of one kind of work say (a kernel and its op, or one enclosing op)."""
    # Inductor's template kernels: flex_attention's (the packed rows' document attention), or a
    # matmul template under max-autotune ("mm" among the fused ops in the name).
    templates = [n for n in names if "triton_tem_" in n]
    if templates:
        return "gemm" if any("mm" in n.split("triton_tem_")[1] for n in templates) else "attention"
    if _has(names, _ATTN):
        return "attention"
    if _has(names, _GEMM_KERNEL) or any(n == g or n.startswith(g + ".") for n in names for g in _GEMM_OP):
        return "gemm"
    if _has(names, ("memcpy", "memset")) or any(n == c for n in names for c in _COPY):
        return "copies"
    if _has(names, _ELEMENTWISE):
        return "norm_elementwise"
    return None


def categorize(kernel: str, launcher: str | None, ancestors: list[str]) -> str:
    """See _categorize; cached, since a step launches the same kernel from the same ops many times."""
    return _categorize(kernel, launcher, tuple(ancestors))


@functools.lru_cache(maxsize=65536)
def _categorize(kernel: str, launcher: str | None, ancestors: tuple[str, ...]) -> str:
    """The category of one kernel from its own name, the op that launched it and that op's enclosing
    ops and annotations (innermost first), compared lower case. Regions win over kernel kinds except
    matmuls and attention (communication, the optimizer step, the log-prob path), then the kernel's own
    kind, then the innermost enclosing op that names one (a view op inside aten::linear is gemm work)."""
    own = [kernel.lower(), (launcher or "").lower()]
    up = [a.lower() for a in ancestors]
    if _has(own + up, _COMM):
        return "communication"
    kind = _by_name(own)
    if kind in ("attention", "gemm"):
        return kind
    if _has(own + up, _OPTIM):
        return "optimizer"
    if _has(own + up, _LOGPROB_REGION):
        return "logsoftmax_loss"
    if kind is not None:
        return kind
    for name in up:
        if (kind := _by_name([name])) is not None:
            return kind
    return "other"


def _ancestors(event) -> list[str]:
    out, e = [], event.cpu_parent
    while e is not None:
        out.append(e.name)
        e = e.cpu_parent
    return out


def _kernel_owners(events):
    """A function: device event -> the CPU op that launched it (None where none is found)."""
    from collections import defaultdict

    from torch.autograd import DeviceType

    cpu = [e for e in events if e.device_type == DeviceType.CPU]
    if all(hasattr(e, "linked_correlation_id") for e in events):
        ops = {e.id: e for e in cpu if e.linked_correlation_id == 0}
        return lambda e: ops.get(e.linked_correlation_id)
    # torch <= 2.11's FunctionEvent carries no correlation id (seen on the H200); its profiler appended
    # each kernel (name, duration) to the op that launched it instead: match device events to those.
    launched = defaultdict(list)
    for op in cpu:
        for k in op.kernels:
            launched[(k.name, round(k.duration, 3))].append(op)

    def owner(e):
        ops = launched.get((e.name, round(e.time_range.end - e.time_range.start, 3)))
        return ops.pop() if ops else None

    return owner


def kernels(events, device: str) -> list[tuple[str, float, float]]:
    """(category, start_us, duration_us) of every kernel of `events` (a profiler's events()).

    CUDA: each device event, with the op whose correlation id it carries (none found: its name alone).
    CPU: each aten op's self time (its duration less its child ops'), so nested ops count once."""
    from torch.autograd import DeviceType

    out = []
    if device == "cuda":
        owner_of = _kernel_owners(events)
        for e in events:
            if e.device_type != DeviceType.CUDA:
                continue
            op = owner_of(e)
            # A runtime call (cudaLaunchKernel, cuLaunchKernel for triton) stands for its parent op.
            while op is not None and op.name.lower().startswith("cu") and op.cpu_parent is not None:
                op = op.cpu_parent
            cat = categorize(e.name, op.name if op else None, _ancestors(op) if op else [])
            out.append((cat, e.time_range.start, e.time_range.end - e.time_range.start))
        return out
    for e in events:
        if e.device_type == DeviceType.CPU and e.name.startswith("aten::"):
            out.append((categorize(e.name, e.name, _ancestors(e)), e.time_range.start, e.self_cpu_time_total))
    return out


def _union_us(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, dur in sorted(spans):
        stop = start + dur
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def breakdown(events, step_s: float, device: str) -> dict:
    """Milliseconds per category, kernel/busy/idle time and each category's share of the step."""
    ks = kernels(events, device)
    ms = {c: 0.0 for c in CATEGORIES}
    for cat, _, dur in ks:
        ms[cat] += dur / 1000.0
    kernel_ms = sum(ms.values())
    # GPU kernels of several streams overlap; CPU self times (one thread) do not, but sit inside their
    # parents' spans, so their union would be wrong: their sum is the busy time.
    busy_us = _union_us([(s, d) for _, s, d in ks]) if device == "cuda" else sum(d for _, _, d in ks)
    busy_ms = min(busy_us / 1000.0, step_s * 1000.0)
    step_ms = step_s * 1000.0
    return {
        "step_ms": step_ms,
        "kernel_ms": kernel_ms,
        "busy_ms": busy_ms,
        "idle_ms": step_ms - busy_ms,
        "kernels": len(ks),
        "categories": ms,
        "percent_of_step": {c: 100.0 * v / step_ms for c, v in ms.items()}
        | {"idle": 100 * (step_ms - busy_ms) / step_ms},
    }


def table(b: dict) -> str:
    """The breakdown as printed lines: ms and % of the step per category, then idle."""
    lines = [f"{'category':>18} {'ms':>9} {'% step':>7}"]
    for c in CATEGORIES:
        lines.append(f"{c:>18} {b['categories'][c]:9.2f} {b['percent_of_step'][c]:6.1f}%")
    lines.append(f"{'idle':>18} {b['idle_ms']:9.2f} {b['percent_of_step']['idle']:6.1f}%")
    lines.append(
        f"{'':>18} step {b['step_ms']:.2f} ms, {b['kernels']} kernels, {b['kernel_ms']:.2f} ms kernel time, "
        f"{b['busy_ms']:.2f} ms busy"
    )
    return "\n".join(lines)
