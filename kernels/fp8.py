"""FP8 (e4m3) row-wise scaled linear layers: a Triton activation quantiser, ``torch._scaled_mm``, and a
plain PyTorch reference that applies the same rounding (for CPUs and for testing the kernel).

Scheme (row-wise / "per-token, per-channel"): weights [N, K] are quantised once, one scale per output
row; activations [M, K] are quantised at run time, one scale per row (token), scale = amax / 448 so
the row's largest value maps to e4m3's largest finite value. The product accumulates in fp32 and is
scaled back and written in bf16.
"""

from __future__ import annotations

import torch

__all__ = [
    "E4M3_MAX",
    "quantize_rowwise_reference",
    "quantize_rowwise",
    "fp8_linear_reference",
    "fp8_linear",
    "QuantizedWeight",
    "quantize_weight",
]

E4M3_MAX = 448.0
_MIN_SCALE = 1e-12


def quantize_rowwise_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise e4m3 quantisation of a 2-D tensor: (q [M, K] float8_e4m3fn, scale [M, 1] float32)."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    scale = torch.clamp(amax, min=_MIN_SCALE) / E4M3_MAX
    q = torch.clamp(xf / scale, -E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def _triton_quantizer():
    import triton
    import triton.language as tl

    @triton.jit
    def quant_rows(x_ptr, q_ptr, s_ptr, K, stride_x, stride_q, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        x_row = x_ptr + row * stride_x
        q_row = q_ptr + row * stride_q
        amax = tl.zeros([BLOCK], dtype=tl.float32)
        for k0 in range(0, K, BLOCK):
            offs = k0 + tl.arange(0, BLOCK)
            x = tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(x))
        scale = tl.maximum(tl.max(amax, axis=0), 1e-12) / 448.0
        for k0 in range(0, K, BLOCK):
            offs = k0 + tl.arange(0, BLOCK)
            x = tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)
            q = tl.minimum(tl.maximum(x / scale, -448.0), 448.0)
            tl.store(q_row + offs, q.to(tl.float8e4nv), mask=offs < K)
        tl.store(s_ptr + row, scale)

    return quant_rows


_QUANT_KERNEL = None


@torch.library.custom_op("vidtune::quantize_rowwise", mutates_args=())
def _quantize_rowwise_op(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _quantize_rowwise_impl(x)


@_quantize_rowwise_op.register_fake
def _(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device),
            torch.empty((x.shape[0], 1), dtype=torch.float32, device=x.device))


def quantize_rowwise(x: torch.Tensor, traced: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise e4m3 quantisation, fused in one Triton kernel on CUDA (amax, scale, cast in one pass
    over the row); the reference elsewhere.

    Registered as the custom op ``vidtune::quantize_rowwise`` so that torch.compile keeps it inside
    its graph as one opaque node: launching the Triton kernel directly broke the graph at every
    linear layer (``triton._C.libtriton.getenv_bool``, seen with TORCH_LOGS=graph_breaks on the H200).

    With ``traced`` and inside torch.compile, the quantisation is traced as the reference's tensor ops
    instead, so Inductor can fuse it into the kernel that produces ``x`` (RMSNorm and AdaLN modulation,
    GELU) and merge the identical quantisations of the q/k/v input (its CSE). Why: on the H200 the
    opaque kernel was 68.5 ms (4.2%) of the 1,623 ms FP8 + compile pass at 1536x1024x121, on top of
    the bf16 write and re-read of every activation it quantises (round 7, results/benchmarks/
    kernel_choice/round7/). Eager runs keep the Triton kernel either way.
    """
    if traced and torch.compiler.is_compiling():
        return quantize_rowwise_reference(x)
    return _quantize_rowwise_op(x)


def _quantize_rowwise_impl(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    global _QUANT_KERNEL
    if x.device.type != "cuda":
        return quantize_rowwise_reference(x)
    if _QUANT_KERNEL is None:
        _QUANT_KERNEL = _triton_quantizer()
    x = x.contiguous()
    m, k = x.shape
    q = torch.empty((m, k), device=x.device, dtype=torch.float8_e4m3fn)
    s = torch.empty((m, 1), device=x.device, dtype=torch.float32)
    block = min(4096, max(16, 1 << (k - 1).bit_length()))
    _QUANT_KERNEL[(m,)](x, q, s, k, x.stride(0), q.stride(0), BLOCK=block)
    return q, s


class QuantizedWeight:
    """A linear layer's weight quantised row-wise: ``q`` [N, K] e4m3, ``scale`` [N, 1] fp32, bias."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.q = q
        self.scale = scale
        self.scale_row = scale.reshape(1, -1).contiguous()  # [1, N] as _scaled_mm wants it
        self.q_t = q.t()  # [K, N] column-major view, as _scaled_mm wants it
        self.bias = bias


def quantize_weight(linear: torch.nn.Linear) -> QuantizedWeight:
    """Quantise a ``Linear``'s weight once (per output row)."""
    q, scale = quantize_rowwise_reference(linear.weight.detach())
    bias = linear.bias.detach().to(torch.bfloat16) if linear.bias is not None else None
    return QuantizedWeight(q, scale, bias)


def fp8_linear_reference(x: torch.Tensor, w: QuantizedWeight, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Emulates the kernel's rounding: both operands rounded to e4m3 with their row scales, fp32 product."""
    shape = x.shape
    xq, xs = quantize_rowwise_reference(x.reshape(-1, shape[-1]))
    out = (xq.float() * xs) @ (w.q.float() * w.scale).t()
    if w.bias is not None:
        out = out + w.bias.float()
    return out.to(out_dtype).reshape(*shape[:-1], -1)


def fp8_linear(x: torch.Tensor, w: QuantizedWeight, out_dtype: torch.dtype = torch.bfloat16,
               traced: bool = False) -> torch.Tensor:
    """``torch._scaled_mm`` on CUDA (fp32 accumulation, bf16 out); the reference elsewhere. ``traced``:
    see ``quantize_rowwise``."""
    if x.device.type != "cuda":
        return fp8_linear_reference(x, w, out_dtype)
    shape = x.shape
    xq, xs = quantize_rowwise(x.reshape(-1, shape[-1]).contiguous(), traced=traced)
    out = torch._scaled_mm(xq, w.q_t, scale_a=xs, scale_b=w.scale_row, bias=w.bias, out_dtype=out_dtype)
    return out.reshape(*shape[:-1], -1)
