"""3-D neighbourhood attention over the latent (T, H, W) grid: NATTEN's ``na3d`` and a PyTorch reference.

Each query attends to the ``kernel`` nearest tokens per axis (dilation 1), the window shifted inwards
at the borders so every query sees the same number of keys (NATTEN's definition). NATTEN is a GPU-first
package imported lazily: on the H200 its Hopper FNA backend runs, on a CPU its flex backend.
"""

from __future__ import annotations

import torch

__all__ = ["window_mask", "na3d_reference", "na3d", "natten_available"]


def natten_available() -> bool:
    """Whether NATTEN imports here (the H200 image has no NATTEN unless its wheel is carried)."""
    try:
        import natten.functional  # noqa: F401
    except Exception:  # ImportError, or a broken build raising at import
        return False
    return True


def _axis_window(length: int, kernel: int, device: torch.device) -> torch.Tensor:
    """[length, length] bool: key j in query i's window along one axis."""
    i = torch.arange(length, device=device)
    start = (i - kernel // 2).clamp(min=0, max=max(0, length - kernel))
    j = torch.arange(length, device=device)
    return (j[None, :] >= start[:, None]) & (j[None, :] < start[:, None] + kernel)


def window_mask(grid: tuple[int, int, int], kernel: tuple[int, int, int], device: torch.device) -> torch.Tensor:
    """[N, N] bool over raster-ordered tokens of ``grid``: the 3-D neighbourhood of each query."""
    masks = [_axis_window(n, min(k, n), device) for n, k in zip(grid, kernel)]
    m = masks[0][:, None, None, :, None, None] & masks[1][None, :, None, None, :, None] & masks[2][None, None, :, None, None, :]
    n = grid[0] * grid[1] * grid[2]
    return m.reshape(n, n)


def na3d_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grid: tuple[int, int, int],
                   kernel: tuple[int, int, int]) -> torch.Tensor:
    """Masked dense attention on [B, H, N, D] (raster order over ``grid``), fp32 softmax."""
    mask = window_mask(grid, kernel, q.device)
    scores = q.float() @ k.float().transpose(-1, -2) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(~mask, torch.finfo(torch.float32).min)
    return (scores.softmax(-1) @ v.float()).to(q.dtype)


def na3d(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grid: tuple[int, int, int],
         kernel: tuple[int, int, int]) -> torch.Tensor:
    """NATTEN ``na3d`` on [B, H, N, D] tensors in raster order (reshaped to NATTEN's heads-last layout)."""
    from natten.functional import na3d as natten_na3d

    b, h, n, d = q.shape
    kern = tuple(min(kk, g) for kk, g in zip(kernel, grid))
    to_natten = lambda t: t.permute(0, 2, 1, 3).reshape(b, *grid, h, d)  # noqa: E731
    out = natten_na3d(to_natten(q), to_natten(k), to_natten(v), kernel_size=kern)
    return out.reshape(b, n, h, d).permute(0, 2, 1, 3)
