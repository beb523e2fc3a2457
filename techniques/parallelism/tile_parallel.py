"""Tile parallelism: stage-2 spatial tiles spread over ranks.

Tile i is denoised by rank i mod P; every rank then receives every tile's prediction (broadcast from
its owner) and blends them in tile order, so the output is bit-identical to one process: the same
tiles are computed on the same shapes, and the float32 blend adds them in the same order. Ranks beyond
the number of tiles idle (recorded); per-tile caches live on the tile's owner, which always computes it.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from vidtune.techniques.parallelism._dist import (
    broadcast_tensor,
    rank_group,
    require_world,
    suggest_with_feasible_degree,
    world_size,
)
from vidtune.techniques.registry import Knob, Patch, Technique, register

__all__ = ["TileParallel"]


@register("parallelism.tile_parallel")
class TileParallel(Technique):
    """Stage-2 tiles computed on separate ranks, predictions exchanged, blended in tile order."""

    knobs = (Knob("degree", "categorical", off=1, choices=(1, 2, 4, 8), help="ranks sharing the stage-2 tiles (1: off)"),)
    switch = "degree"
    stages = ("stage2",)
    seams = ("parallel.ranks",)
    apply_last = True
    description = "stage-2 tiles spread over ranks (round robin), blended in tile order"

    def applicable(self, request: Any = None) -> bool:
        return world_size() > 1

    def suggest(self, trial: Any, request: Any = None) -> dict[str, Any]:
        return suggest_with_feasible_degree(self, trial)

    def check_request(self, values: dict[str, Any], request: Any) -> None:
        if values["degree"] > 1:
            require_world(f"{self.name}.degree", values["degree"])

    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        rg = rank_group(f"{self.name}.degree", values["degree"])
        patch = Patch(self.name)

        def map_tiles(fn: Callable[[int], tuple[torch.Tensor, torch.Tensor]], n: int) -> list:
            mine = {i: fn(i) for i in range(n) if i % rg.size == rg.rank}
            out = []
            for i in range(n):
                dv, da = mine.get(i, (None, None))
                owner = i % rg.size
                out.append((broadcast_tensor(dv, owner, rg, pipeline.device),
                            broadcast_tensor(da, owner, rg, pipeline.device)))
            pipeline.records[self.name] = {"degree": rg.size, "tiles": n, "tiles_on_this_rank": len(mine),
                                           "idle_ranks": max(0, rg.size - n)}
            return out

        patch.set_attr(pipeline, "map_tiles", map_tiles)
        return patch
