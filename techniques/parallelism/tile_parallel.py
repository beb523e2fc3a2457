"""Tile parallelism: stage-2 spatial tiles spread over ranks.

Tile i is denoised by rank i mod P; every rank then receives every tile's prediction (broadcast from
its owner) and blends them in tile order, so the output is bit-identical to one process: the same
tiles are computed on the same shapes, and the float32 blend adds them in the same order. Ranks beyond
the number of tiles idle (recorded, with a warning); per-tile caches live on the tile's owner, which always
computes it. With one stage-2 tile (the whole frame: the pipeline's single-tile path never maps tiles) every
rank computes the whole frame and nothing is gained; that is recorded and warned about too, because it
is what `vidtune bench --nproc 2 --knobs parallelism.tile_parallel.degree=2` measured on the default
request on two H200s (x0.99, results/benchmarks/parallel/README.md, round 3).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterator

import torch

from vidtune.techniques.parallelism.distributed import (
    broadcast_tensor,
    rank_group,
    require_world,
    feasible_degrees,
    suggest_with_feasible_degree,
    world_size,
)
from vidtune.techniques.registry import Knob, Patch, Technique, register

__all__ = ["TileParallel", "planned_stage2_tiling", "tile_shortage"]

# The stage-2 tiling the pipelines of a running search are built with: a context variable set only by
# planned_stage2_tiling, for a block (None: the reference default)
_PLANNED_TILING: ContextVar[Any] = ContextVar("vidtune_planned_stage2_tiling", default=None)


@contextmanager
def planned_stage2_tiling(tiling: Any) -> Iterator[None]:
    """For a block: the stage-2 tiling (``Stage2Tiling``) the pipelines of a search are built with (a
    campaign's ``eval.stage2_tiles``), so the search can skip tile_parallel settings with nothing to share
    (``None``: the reference default). The earlier plan comes back after the block."""
    token = _PLANNED_TILING.set(tiling)
    try:
        yield
    finally:
        _PLANNED_TILING.reset(token)


@register("parallelism.tile_parallel")
class TileParallel(Technique):
    """Stage-2 tiles computed on separate ranks, predictions exchanged, blended in tile order."""

    knobs = (Knob("degree", "categorical", off=1, choices=(1, 2, 4, 8), help="ranks sharing the stage-2 tiles (1: off)"),)
    switch = "degree"
    stages = ("stage2",)
    seams = ("parallel.ranks", "stage2.tile_map")
    apply_last = True
    description = "stage-2 tiles spread over ranks (round robin), blended in tile order"

    def applicable(self, request: Any = None) -> bool:
        return world_size() > 1

    def neutral(self, request: Any, device: Any) -> dict[str, Any] | None:
        # each tile computed whole by one rank, blended in tile order: bit-identical (parallel_check)
        degrees = [d for d in feasible_degrees(self.knob("degree").choices) if d > 1]
        return {"degree": degrees[0]} if degrees else None

    def suggest(self, trial: Any, request: Any = None) -> dict[str, Any]:
        return suggest_with_feasible_degree(self, trial)

    def check_request(self, values: dict[str, Any], request: Any) -> None:
        if values["degree"] > 1:
            require_world(f"{self.name}.degree", values["degree"])

    def effective(self, values: dict[str, Any], request: Any) -> bool:
        """False when stage 2 has one tile for ``request`` under the planned tiling (the reference default
        unless a campaign planned its own): every rank would denoise the whole frame, the baseline under
        another name. At 1536x1024x121 (24,576 stage-2 tokens) the default is one tile."""
        from vidtune.model.tiles import Stage2Tiling

        planned = _PLANNED_TILING.get()
        tiling = planned if planned is not None else Stage2Tiling()
        rows, cols, _ = tiling.resolve(*request.latent_grid(2))
        return rows * cols > 1

    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        rg = rank_group(f"{self.name}.degree", values["degree"])
        patch = Patch(self.name)

        def record(tiles: int, on_this_rank: int) -> None:
            pipeline.records[self.name] = {"degree": rg.size, "tiles": tiles, "tiles_on_this_rank": on_this_rank,
                                           "idle_ranks": max(0, rg.size - tiles)}
            if tiles < rg.size:
                pipeline.records[self.name]["warning"] = tile_shortage(self.name, rg.size, tiles)

        def map_tiles(fn: Callable[[int], tuple[torch.Tensor, torch.Tensor]], n: int) -> list:
            mine = {i: fn(i) for i in range(n) if i % rg.size == rg.rank}
            out = []
            for i in range(n):
                dv, da = mine.get(i, (None, None))
                owner = i % rg.size
                out.append((broadcast_tensor(dv, owner, rg, pipeline.device),
                            broadcast_tensor(da, owner, rg, pipeline.device)))
            record(n, len(mine))
            return out

        stage2 = pipeline.stage2

        def stage2_recorded(*args: Any, **kwargs: Any) -> Any:
            out = stage2(*args, **kwargs)
            if self.name not in pipeline.records:  # one tile: map_tiles never ran, every rank did the whole frame
                record(1, 1)
            return out

        patch.set_attr(pipeline, "map_tiles", map_tiles)
        patch.set_attr(pipeline, "stage2", stage2_recorded)
        return patch


def tile_shortage(name: str, degree: int, tiles: int) -> str:
    """The warning recorded when a degree has more ranks than there are stage-2 tiles."""
    what = "the whole frame on every rank, nothing shared" if tiles == 1 else f"{degree - tiles} of {degree} ranks idle"
    return (f"{name}.degree={degree} with {tiles} stage-2 tile{'s' if tiles > 1 else ''}: {what}; "
            f"use tiling.stage2_tiles (or eval.stage2_tiles) rows x cols >= {degree}")
