"""8-bit attention: Q.K^T in INT8, P.V in FP8 (e4m3), accumulated in float32 (SageAttention-2 style).

The arithmetic, the same in the PyTorch reference and the Triton kernel:

1. K is *smoothed*: its mean over the sequence (per batch, head and channel) is subtracted. For every query
   row, q . (k_j - mean) = q . k_j - q . mean, and the second term is the same for every key j of the row, so
   the softmax is unchanged; what changes is K's range, which no longer carries the channel offsets that
   video keys share (SageAttention's observation), and INT8 keeps more of what differs between keys.
2. Q (per block of ``BLOCK_M`` query tokens) and the smoothed K (per block of ``BLOCK_N`` key tokens) are
   quantised to INT8 with one scale a block (absolute maximum / 127); the scores are the INT32 dot products
   times the two scales and the softmax scale (exact in INT32: at most 127^2 x head_dim).
3. The softmax runs online over the key blocks (base 2). Each block's unnormalised probabilities
   p = 2^(s - m) lie in [0, 1]; they are scaled by 448 (FP8 e4m3's largest value) and cast to FP8, V is cast
   to FP8 with one scale per channel (absolute maximum over the sequence / 448), and P.V is an FP8 dot with a
   float32 accumulator. The row sums l use p before its cast (float32).
4. The output is acc / l, times V's channel scales over 448, in the inputs' dtype.

Hopper runs both dots on its tensor cores (wgmma INT8 and FP8, twice bf16's rate), and the operands are half
the bytes. The quantisation of Q, K and V is done here in PyTorch (one pass over each, against the
attention's O(N^2)). Off a GPU the kernel runs in Triton's interpreter when TRITON_INTERPRET=1 is set before
Triton is first imported (how CI compares it with the reference). Triton 3.9's interpreter casts float32 to FP8
wrongly where rounding carries into the exponent (125.7 -> 64, not 128) and below e4m3's normal range, so under
the interpreter the kernel rounds P to the FP8 grid itself first (its cast is then exact); on a GPU the cast is
the hardware's.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from vidtune.kernels.triton_runtime import triton_available

__all__ = ["BLOCK_M", "BLOCK_N", "Quantized", "quantize", "attention8_reference", "attention8_triton", "launch",
           "attention8_op", "ATTENTION8_BACKENDS"]

BLOCK_M = 128  # query tokens per program and per Q scale
BLOCK_N = 64  # key tokens per loop step and per K scale
P_SCALE = 448.0  # FP8 e4m3's largest finite value: the probabilities' and V's full range
ATTENTION8_BACKENDS = ("reference", "triton")
_LOG2E = 1.4426950408889634


class Quantized(NamedTuple):
    """Q, the smoothed K and V of [B, H, N, D] attention in 8 bits, their tokens padded to whole blocks."""

    q: torch.Tensor  # int8 [B, H, Nq_pad, D]
    q_scale: torch.Tensor  # float32 [B, H, Nq_pad / block_m]
    k: torch.Tensor  # int8 [B, H, Nk_pad, D], the key mean over the sequence subtracted
    k_scale: torch.Tensor  # float32 [B, H, Nk_pad / block_n]
    v: torch.Tensor  # float8_e4m3fn [B, H, Nk_pad, D]
    v_scale: torch.Tensor  # float32 [B, H, D]: V = v * v_scale
    nq: int
    nk: int


def _int8_blocks(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [B, H, N, D] (float32) as int8 with one scale per block of ``block`` tokens, N padded with zeros."""
    b, h, n, d = x.shape
    pad = -n % block
    if pad:
        x = torch.nn.functional.pad(x, (0, 0, 0, pad))
    blocks = x.reshape(b, h, -1, block, d)
    scale = blocks.abs().amax(dim=(3, 4)).clamp_min(1e-12) / 127.0
    q = torch.round(blocks / scale[..., None, None]).clamp_(-127, 127).to(torch.int8)
    return q.reshape(b, h, -1, d), scale


def quantize(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_m: int = BLOCK_M,
             block_n: int = BLOCK_N) -> Quantized:
    """Q, K and V of [B, H, N, D] attention in 8 bits (the module's steps 1 and 2, and V's cast of step 3)."""
    nq, nk = q.shape[2], k.shape[2]
    kf = k.float()
    qi, qs = _int8_blocks(q.float(), block_m)
    ki, ks = _int8_blocks(kf - kf.mean(dim=2, keepdim=True), block_n)
    vf = v.float()
    pad = -nk % block_n
    if pad:
        vf = torch.nn.functional.pad(vf, (0, 0, 0, pad))
    v_scale = vf.abs().amax(dim=2).clamp_min(1e-12) / P_SCALE
    v8 = (vf / v_scale[:, :, None, :]).to(torch.float8_e4m3fn)
    return Quantized(qi, qs, ki, ks, v8, v_scale, nq, nk)


def attention8_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_m: int = BLOCK_M,
                         block_n: int = BLOCK_N) -> torch.Tensor:
    """The module's arithmetic in PyTorch on [B, H, N, D] tensors (any device): the same quantisation and the
    same online softmax over key blocks as the kernel, each dot's integer or FP8 products summed in float32."""
    z = quantize(q, k, v, block_m, block_n)
    scale = _LOG2E / math.sqrt(q.shape[-1])
    b, h, nq_pad, d = z.q.shape
    m = torch.full((b, h, nq_pad), -math.inf, device=q.device)
    l = torch.zeros(b, h, nq_pad, device=q.device)
    acc = torch.zeros(b, h, nq_pad, d, device=q.device)
    for j in range(z.k.shape[2] // block_n):
        kj = z.k[:, :, j * block_n:(j + 1) * block_n].float()
        # (the integer dot first, then its scales: as the kernel's INT32 accumulator)
        s = torch.einsum("bhqd,bhkd->bhqk", z.q.float(), kj) * (
            z.q_scale.repeat_interleave(block_m, dim=2)[..., None] * z.k_scale[:, :, j, None, None] * scale)
        keys = torch.arange(j * block_n, (j + 1) * block_n, device=q.device)
        s = s.masked_fill(keys >= z.nk, -math.inf)
        m_new = torch.maximum(m, s.amax(dim=-1))
        alpha = torch.exp2(m - m_new)
        p = torch.exp2(s - m_new[..., None])
        l = l * alpha + p.sum(dim=-1)
        p8 = (p * P_SCALE).to(torch.float8_e4m3fn).float()
        acc = acc * alpha[..., None] + torch.einsum("bhqk,bhkd->bhqd", p8, z.v[:, :, j * block_n:(j + 1) * block_n].float())
        m = m_new
    out = acc / l[..., None] * (z.v_scale[:, :, None, :] / P_SCALE)
    return out[:, :, : z.nq].to(q.dtype)


_KERNEL: dict[str, Any] = {}


def _kernel() -> Any:
    """Build (once) the jitted kernel; the interpreter choice is made when Triton is first imported."""
    if "k" in _KERNEL:
        return _KERNEL["k"]
    import triton
    import triton.language as tl

    @triton.jit
    def attention8_fwd(Q, QS, K, KS, V, VS, O, nq, nk, n_kblocks, scale,
                       stride_qh, stride_qn, stride_kh, stride_kn, stride_oh, stride_on, stride_qsh, stride_ksh,
                       D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, P_SCALE: tl.constexpr,
                       ROUND_FP8: tl.constexpr):
        # One program: BLOCK_M query rows of one (batch x head); QS, KS its blocks' scales, VS V's channel scales.
        mb, bh = tl.program_id(0), tl.program_id(1)
        rows = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, D)
        q = tl.load(Q + bh * stride_qh + rows[:, None] * stride_qn + cols[None, :])  # int8, padded rows are zeros
        q_scale = tl.load(QS + bh * stride_qsh + mb) * scale
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        for j in range(0, n_kblocks):
            keys = j * BLOCK_N + tl.arange(0, BLOCK_N)
            k = tl.load(K + bh * stride_kh + keys[:, None] * stride_kn + cols[None, :])
            s = tl.dot(q, tl.trans(k), out_dtype=tl.int32).to(tl.float32) * (q_scale * tl.load(KS + bh * stride_ksh + j))
            s = tl.where((keys < nk)[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V + bh * stride_kh + keys[:, None] * stride_kn + cols[None, :])  # float8e4nv
            p8 = p * P_SCALE
            if ROUND_FP8:  # (the interpreter's float32 -> FP8 cast loses a rounding's carry: round first, exactly)
                step = tl.exp2(tl.maximum(tl.floor(tl.log2(tl.maximum(p8, 1e-30))), -6.0) - 3.0)
                p8 = tl.floor(p8 / step + 0.5) * step
            acc = acc * alpha[:, None] + tl.dot(p8.to(tl.float8e4nv), v, out_dtype=tl.float32)
            m_i = m_new
        v_scale = tl.load(VS + bh * D + cols) / P_SCALE
        out = acc / l_i[:, None] * v_scale[None, :]
        tl.store(O + bh * stride_oh + rows[:, None] * stride_on + cols[None, :], out.to(O.dtype.element_ty),
                 mask=(rows < nq)[:, None])

    _KERNEL["k"] = attention8_fwd
    return attention8_fwd


def attention8_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_m: int = BLOCK_M,
                      block_n: int = BLOCK_N) -> torch.Tensor:
    """The Triton kernel on [B, H, N, D] tensors (CUDA, or the interpreter): the reference's numbers up to the
    dots' summation order."""
    if not triton_available(q.device):
        raise RuntimeError(f"attention8_triton needs a CUDA device (got {q.device}) or TRITON_INTERPRET=1")
    d = q.shape[-1]
    if d & (d - 1) or d < 16:
        raise ValueError(f"attention8_triton takes head dims that are powers of two >= 16, got {d}")
    return launch(quantize(q, k, v, block_m, block_n), q.dtype, block_m, block_n)


def launch(z: Quantized, dtype: torch.dtype, block_m: int = BLOCK_M, block_n: int = BLOCK_N) -> torch.Tensor:
    """The kernel alone on quantised inputs (``quantize``'s, with the same blocks): [B, H, Nq, D] in ``dtype``."""
    b, h, _, d = z.q.shape
    out = torch.empty(b * h, z.nq, d, dtype=dtype, device=z.q.device)
    qi, ki, v8 = (t.reshape(b * h, t.shape[2], d) for t in (z.q, z.k, z.v))
    qs, ks = z.q_scale.reshape(b * h, -1), z.k_scale.reshape(b * h, -1)
    grid = (qi.shape[1] // block_m, b * h)
    _kernel()[grid](qi, qs, ki, ks, v8, z.v_scale.reshape(b * h, d).contiguous(), out, z.nq, z.nk,
                    ki.shape[1] // block_n, _LOG2E / math.sqrt(d), qi.stride(0), qi.stride(1), ki.stride(0),
                    ki.stride(1), out.stride(0), out.stride(1), qs.stride(0), ks.stride(0), D=d, BLOCK_M=block_m,
                    BLOCK_N=block_n, P_SCALE=P_SCALE, ROUND_FP8=not z.q.is_cuda, num_warps=8 if block_m >= 128 else 4)
    return out.reshape(b, h, z.nq, d)


@torch.library.custom_op("vidtune::attention8", mutates_args=())
def _attention8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str) -> torch.Tensor:
    if backend == "reference":
        return attention8_reference(q, k, v)
    if backend == "triton":
        return attention8_triton(q, k, v)
    raise ValueError(f"backend must be one of {list(ATTENTION8_BACKENDS)}, got {backend!r}")


@_attention8.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str) -> torch.Tensor:
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)


def attention8_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str = "triton") -> torch.Tensor:
    """8-bit attention on [B, H, N, D] tensors through one opaque operator (a compiled block keeps it in its
    graph: Dynamo cannot trace the Triton launcher, as with Sol's kernels/sol_ops.py)."""
    return _attention8(q, k, v, backend)
