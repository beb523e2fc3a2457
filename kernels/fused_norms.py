"""Fused elementwise kernels of the LTX-2 block: AdaLN-modulated RMSNorm and the gated residual add.

In an eager LTX-2 block every modulation is four kernels (RMSNorm, 1 + scale, multiply, add shift),
each reading and writing the whole activation, and every residual is two (multiply by the gate, add).
At 1536x1024 that elementwise traffic is about a quarter of the kernel time. The Triton kernels here
read x once and write once:

    adaln_rmsnorm(x, scale, shift) = rmsnorm(x) * (1 + scale) + shift      (float32 inside)
    gated_residual(x, y, gate)     = x + y * gate                          (float32 inside)

``scale``, ``shift`` and ``gate`` are per token ([B, T, C]) or per sample ([B, 1, C]), as LTX-2's AdaLN
gives them. The references are the unfused PyTorch expressions in ltx-core's order (bit-identical to the
block's own arithmetic); they run anywhere. The Triton kernels need CUDA, or Triton's interpreter
(TRITON_INTERPRET=1 before Triton is imported), where inputs are computed in float32.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["adaln_rmsnorm_reference", "gated_residual_reference", "adaln_rmsnorm_triton", "gated_residual_triton"]

_K: dict[str, Any] = {}


def adaln_rmsnorm_reference(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, eps: float) -> torch.Tensor:
    """ltx-core's ``rms_norm(x) * (1 + scale) + shift``, op for op."""
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), eps=eps) * (1 + scale) + shift


def gated_residual_reference(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """ltx-core's ``x + y * gate``."""
    return x + y * gate


def _kernels() -> dict[str, Any]:
    if _K:
        return _K
    import triton
    import triton.language as tl

    @triton.jit
    def adaln_fwd(X, SCALE, SHIFT, Y, n_rows, C, s_row_stride, s_batch_stride, rows_per_batch, eps,
                  ROWS: tl.constexpr, BLOCK_C: tl.constexpr):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_C)
        m = (rows[:, None] < n_rows) & (cols[None, :] < C)
        x = tl.load(X + rows[:, None] * C + cols[None, :], mask=m, other=0.0).to(tl.float32)
        srow = (rows // rows_per_batch) * s_batch_stride + (rows % rows_per_batch) * s_row_stride
        sc = tl.load(SCALE + srow[:, None] + cols[None, :], mask=m, other=0.0).to(tl.float32)
        sh = tl.load(SHIFT + srow[:, None] + cols[None, :], mask=m, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, 1) / C + eps)
        y = x * rstd[:, None] * (1.0 + sc) + sh
        tl.store(Y + rows[:, None] * C + cols[None, :], y.to(Y.dtype.element_ty), mask=m)

    @triton.jit
    def gated_fwd(X, R, G, Y, n_rows, C, g_row_stride, g_batch_stride, rows_per_batch,
                  ROWS: tl.constexpr, BLOCK_C: tl.constexpr):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_C)
        m = (rows[:, None] < n_rows) & (cols[None, :] < C)
        x = tl.load(X + rows[:, None] * C + cols[None, :], mask=m, other=0.0).to(tl.float32)
        r = tl.load(R + rows[:, None] * C + cols[None, :], mask=m, other=0.0).to(tl.float32)
        grow = (rows // rows_per_batch) * g_batch_stride + (rows % rows_per_batch) * g_row_stride
        g = tl.load(G + grow[:, None] + cols[None, :], mask=m, other=0.0).to(tl.float32)
        tl.store(Y + rows[:, None] * C + cols[None, :], (x + r * g).to(Y.dtype.element_ty), mask=m)

    _K.update(adaln=adaln_fwd, gated=gated_fwd)
    return _K


def _tiles(c: int) -> tuple[int, int]:
    """(columns, rows) per program: a whole row of C, and as many rows as fit in 4096 elements."""
    import triton

    bc = triton.next_power_of_2(c)
    return bc, max(1, min(64, 4096 // bc))


def _mod_strides(t: torch.Tensor, b: int, rows: int, c: int) -> tuple[torch.Tensor, int, int]:
    """A modulation tensor [B, T or 1, C] as a contiguous buffer with (row stride, batch stride)."""
    t = t.expand(b, t.shape[1], c).contiguous()
    per_token = t.shape[1] == rows and rows > 1
    return t, (c if per_token else 0), t.shape[1] * c


def _prep(x: torch.Tensor, *mods: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor], torch.dtype]:
    dtype = x.dtype
    if x.device.type != "cuda":  # Triton's interpreter: float32 (it mishandles bf16)
        return x.float().contiguous(), [m.float() for m in mods], dtype
    return x.contiguous(), list(mods), dtype


def adaln_rmsnorm_triton(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, eps: float) -> torch.Tensor:
    """The fused kernel, called through the custom op ``vidtune::adaln_rmsnorm``: under torch.compile it
    is one opaque graph node (a direct Triton launch breaks the graph, as the FP8 quantiser's did)."""
    return _adaln_op(x, scale, shift, float(eps))


def gated_residual_triton(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """The fused kernel, through the custom op ``vidtune::gated_residual`` (one graph node under compile)."""
    return _gated_op(x, y, gate)


@torch.library.custom_op("vidtune::adaln_rmsnorm", mutates_args=())
def _adaln_op(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, eps: float) -> torch.Tensor:
    return _adaln_impl(x, scale, shift, eps)


@_adaln_op.register_fake
def _(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("vidtune::gated_residual", mutates_args=())
def _gated_op(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return _gated_impl(x, y, gate)


@_gated_op.register_fake
def _(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _adaln_impl(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, eps: float) -> torch.Tensor:
    import triton

    b, t, c = x.shape
    xc, (sc, sh), dtype = _prep(x, scale, shift)
    sc, rs, bs = _mod_strides(sc, b, t, c)
    sh, _, _ = _mod_strides(sh, b, t, c)
    out = torch.empty_like(xc)
    bc, rows = _tiles(c)
    _kernels()["adaln"][(triton.cdiv(b * t, rows),)](xc, sc, sh, out, b * t, c, rs, bs, t, eps, ROWS=rows, BLOCK_C=bc)
    return out.to(dtype)


def _gated_impl(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    import triton

    b, t, c = x.shape
    xc, (yc, g), dtype = _prep(x, y, gate)
    yc = yc.contiguous()
    g, rs, bs = _mod_strides(g, b, t, c)
    out = torch.empty_like(xc)
    bc, rows = _tiles(c)
    _kernels()["gated"][(triton.cdiv(b * t, rows),)](xc, yc, g, out, b * t, c, rs, bs, t, ROWS=rows, BLOCK_C=bc)
    return out.to(dtype)
