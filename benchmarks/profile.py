"""Where a pass spends its time: kernel time by category (GEMM, attention, fused/elementwise, copies).

The kernel-choice targets are argued from such a split (docs/architecture.md: at 1536x1024 the pass is GEMM
41%, attention 35%, other 24%); ``bench_kernels --profile`` records it for the baseline and for every
setting, so a missed target comes with the profile that shows why.

On CUDA the categories sum the device time of the kernels (``torch.profiler``, CUDA activity); on a CPU
(a smoke test) they sum the self time of the aten operators. Categories are decided from the kernel or
operator name by ``kernel_category``; its patterns are written from kernel names seen on the H200
(cuDNN SDPA, flash, cuBLAS/CUTLASS/nvjet GEMMs, Inductor's Triton kernels, vidtune's own kernels).
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any, Callable

import torch

__all__ = ["CATEGORIES", "kernel_category", "profile_pass"]

CATEGORIES = ("attention", "gemm", "fused_triton", "elementwise", "copy")

# Order matters. Fused elementwise kernels by name first: Inductor's pointwise/reduction kernels are
# named after the ops they fuse, and the RoPE/norm prologue of a compiled attention is called e.g.
# "triton_poi_fused__fused_rms_norm__scaled_dot_product_cudnn_attention_addcmul_..." (H200, round 7),
# which the attention rule took for attention; vidtune's own are the activation quantiser (kernels/fp8.py,
# "quant_rows" on the H200) and the fused_norms kernels. Then attention before gemm (attention kernels may
# contain "gemm" in their names), Sol and Triton attention and Inductor's GEMM templates before the
# generic Triton rule.
_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("fused_triton", re.compile(r"^triton_(poi|red|per)_|_quantize|quant_rows|adaln|gated_residual", re.I)),
    ("attention", re.compile(r"sdpa|fmha|flash|attention|attn|_sol_|scaled_dot_product", re.I)),
    ("gemm", re.compile(r"gemm|xmma|cutlass|nvjet|cublas|_scaled_mm|triton_tem|\bmm\b|addmm|bmm|matmul|linear|wgmma"
                        r"|f8f8", re.I)),
    ("fused_triton", re.compile(r"triton", re.I)),  # any other Triton kernel
    ("copy", re.compile(r"memcpy|memset|copy_|\bcopy\b|cat\b|_to_copy|contiguous", re.I)),
)


def kernel_category(name: str) -> str:
    """The category of a kernel (CUDA) or aten operator (CPU) name; ``elementwise`` when no rule matches
    (norms, activations, RoPE, adds and the rest of the unfused work)."""
    for category, pattern in _RULES:
        if pattern.search(name):
            return category
    return "elementwise"


def _self_time_us(event: Any, device: bool) -> float:
    if device:
        return float(getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0.0))
    return float(event.self_cpu_time_total)


def profile_pass(fn: Callable[[], Any], device: torch.device, top: int = 12) -> dict[str, Any]:
    """Run ``fn`` once under the profiler; kernel (or, on a CPU, operator) time per category in ms and
    as a share, and the ``top`` kernels by time. Call it warm (after compile and autotune)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    on_cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    with profile(activities=activities) as prof:
        fn()
        if on_cuda:
            torch.cuda.synchronize(device)
    per_kernel: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        if on_cuda:
            if event.device_type != DeviceType.CUDA:
                continue
        elif not event.key.startswith("aten::") or event.key in ("aten::empty", "aten::empty_strided"):
            continue
        per_kernel[event.key] += _self_time_us(event, on_cuda)
    total = sum(per_kernel.values())
    by_cat = {c: 0.0 for c in CATEGORIES}
    for name, us in per_kernel.items():
        by_cat[kernel_category(name)] += us
    ranked = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:top]
    return {
        "measure": "CUDA kernel time" if on_cuda else "CPU self time of aten operators",
        "total_ms": total / 1e3,
        "ms": {c: v / 1e3 for c, v in by_cat.items()},
        "share": {c: (v / total if total else 0.0) for c, v in by_cat.items()},
        "top": [{"name": n[:160], "ms": us / 1e3, "category": kernel_category(n)} for n, us in ranked],
    }
