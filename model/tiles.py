"""Stage-2 spatial tiles: overlapping latent windows with complementary blend masks.

Each tile is denoised as if it were a small video of its own (its RoPE positions re-based to start at
zero), and the tiles' predictions are blended with separable trapezoid masks that sum to one at every
latent pixel (a partition of unity), so a one-tile grid is exactly the whole-frame computation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["Stage2Tiling", "Tile", "plan_tiles", "axis_intervals", "blend_weights"]

# Above this many stage-2 video tokens the default cuts the frame into tiles (the 19B shape at
# 1536x1024x121 has 24,576 tokens and runs whole; 4K has 130,560).
DEFAULT_WHOLE_FRAME_MAX_TOKENS = 32_768


@dataclass(frozen=True)
class Stage2Tiling:
    """Tile grid for stage 2. ``rows == cols == 0`` means automatic (see ``resolve``).

    Attributes:
        rows: tiles along the latent height (0: automatic).
        cols: tiles along the latent width (0: automatic).
        overlap: overlap between neighbouring tiles in latent pixels (-1: automatic, a quarter tile).
        whole_frame_max_tokens: automatic mode runs one whole tile up to this many video tokens.
    """

    rows: int = 0
    cols: int = 0
    overlap: int = -1
    whole_frame_max_tokens: int = DEFAULT_WHOLE_FRAME_MAX_TOKENS

    def resolve(self, frames: int, height: int, width: int) -> tuple[int, int, int]:
        """Concrete (rows, cols, overlap) for a latent grid of ``frames x height x width``."""
        rows, cols = self.rows, self.cols
        if rows == 0 or cols == 0:
            tokens = frames * height * width
            if tokens <= self.whole_frame_max_tokens:
                rows = cols = 1
            else:
                # Smallest near-square grid whose tiles (before overlap) fit the budget; the large
                # default overlap then mimics the official VAE tiling's generous overlaps.
                n = math.ceil(tokens / self.whole_frame_max_tokens)
                rows = max(1, round(math.sqrt(n * height / width)))
                cols = max(1, math.ceil(n / rows))
        overlap = self.overlap
        if overlap < 0:
            overlap = 0 if rows == cols == 1 else max(1, min(height // rows, width // cols) // 4)
        for axis, n, size in (("rows", rows, height), ("cols", cols, width)):
            if n < 1 or n > size:
                raise ValueError(f"stage2 tiling {axis} must be in [1, {size}] for a latent size of {size}, got {n}")
        return rows, cols, overlap


@dataclass(frozen=True)
class Tile:
    """One tile: latent slices along height and width plus its blend weights [h, w]."""

    ys: slice
    xs: slice
    weight: torch.Tensor


def axis_intervals(length: int, count: int, overlap: int) -> list[tuple[int, int]]:
    """Split ``[0, length)`` into ``count`` intervals that overlap by ``overlap`` (checked)."""
    if count == 1:
        return [(0, length)]
    core = (length + (count - 1) * overlap) / count  # tile length so that tiles cover the axis
    if overlap < 0 or overlap * 2 > core:
        raise ValueError(
            f"stage2 tile overlap must be >= 0 and at most half a tile ({int(core) // 2} latent pixels "
            f"for {count} tiles over {length}), got {overlap}"
        )
    starts = [round(i * (core - overlap)) for i in range(count)]
    out = []
    for i, s in enumerate(starts):
        e = length if i == count - 1 else round(s + core)
        out.append((s, e))
    return out


def _axis_weights(length: int, intervals: list[tuple[int, int]]) -> list[torch.Tensor]:
    """Per-interval 1-D trapezoid weights normalised so that they sum to one at each position."""
    raw = []
    for i, (s, e) in enumerate(intervals):
        w = torch.ones(e - s, dtype=torch.float64)
        if i > 0:  # ramp up over the overlap with the previous interval
            ov = intervals[i - 1][1] - s
            if ov > 0:
                w[:ov] = torch.arange(1, ov + 1, dtype=torch.float64) / (ov + 1)
        if i < len(intervals) - 1:
            ov = e - intervals[i + 1][0]
            if ov > 0:
                w[-ov:] = torch.minimum(w[-ov:], torch.arange(ov, 0, -1, dtype=torch.float64) / (ov + 1))
        raw.append(w)
    total = torch.zeros(length, dtype=torch.float64)
    for (s, e), w in zip(intervals, raw):
        total[s:e] += w
    return [w / total[s:e] for (s, e), w in zip(intervals, raw)]


def plan_tiles(height: int, width: int, rows: int, cols: int, overlap: int) -> list[Tile]:
    """The tiles of a ``rows x cols`` grid over a ``height x width`` latent, with blend weights."""
    yi, xi = axis_intervals(height, rows, overlap), axis_intervals(width, cols, overlap)
    yw, xw = _axis_weights(height, yi), _axis_weights(width, xi)
    tiles = []
    for (ys, ye), wy in zip(yi, yw):
        for (xs, xe), wx in zip(xi, xw):
            tiles.append(Tile(slice(ys, ye), slice(xs, xe), (wy[:, None] * wx[None, :]).float()))
    return tiles


def blend_weights(height: int, width: int, tiles: list[Tile]) -> torch.Tensor:
    """Sum of every tile's weights on the full grid (1 everywhere for a valid plan)."""
    total = torch.zeros(height, width)
    for t in tiles:
        total[t.ys, t.xs] += t.weight
    return total


def denoised_area_factor(height: int, width: int, tiles: list[Tile]) -> float:
    """How many times each latent pixel is computed on average (1.0 for whole frame)."""
    area = sum((t.ys.stop - t.ys.start) * (t.xs.stop - t.xs.start) for t in tiles)
    return area / (height * width)
