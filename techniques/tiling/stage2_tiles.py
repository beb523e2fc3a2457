"""Stage-2 tile grid: rows, columns and overlap (latent pixels) of the spatial tiles.

Off is the reference default (whole frame up to ~32k tokens, else a near-square grid with a quarter-
tile overlap, generous like the official VAE tiling), so the search can find thinner overlaps or fewer
tiles. The trial record gets the denoised area factor (latent pixels computed per latent pixel).
"""

from __future__ import annotations

from typing import Any

from vidtune.model.tiles import Stage2Tiling, plan_tiles
from vidtune.techniques.registry import Knob, KnobError, Patch, Technique, register


@register("tiling.stage2_tiles")
class Stage2Tiles(Technique):
    """Choose the stage-2 tile grid and overlap."""

    knobs = (
        Knob("rows", "int", off=0, low=0, high=8, help="tiles along the height (0: reference default)"),
        Knob("cols", "int", off=0, low=0, high=8, help="tiles along the width (0: reference default)"),
        Knob("overlap", "int", off=-1, low=-1, high=32, help="overlap in latent pixels (-1: reference default)",
             scales="size"),
    )
    stages = ("stage2",)
    seams = ("stage2.tiles",)
    description = "stage-2 spatial tiles (rows x cols, overlap) with complementary blend masks"

    def check(self, values: dict[str, Any]) -> None:
        if (values["rows"] == 0) != (values["cols"] == 0):
            raise KnobError(f"{self.name}.rows and .cols must both be 0 (default) or both >= 1, "
                            f"got rows={values['rows']} cols={values['cols']}")

    def check_request(self, values: dict[str, Any], request: Any) -> None:
        """Reject overlaps of half a tile or more for this request's latent grid, before any work."""
        tiling = self._tiling(values, Stage2Tiling())
        f, h, w = request.latent_grid(2)
        try:
            rows, cols, overlap = tiling.resolve(f, h, w)
            plan_tiles(h, w, rows, cols, overlap)
        except ValueError as exc:
            raise KnobError(f"{self.name}: {exc}") from None

    def neutral(self, request: Any, device: Any) -> dict[str, Any]:
        # the reference default's grid, given explicitly
        rows, cols, overlap = Stage2Tiling().resolve(*request.latent_grid(2))
        return {"rows": rows, "cols": cols, "overlap": overlap if rows * cols > 1 else 0}

    def suggest(self, trial: Any, request: Any = None) -> dict[str, Any]:
        """Grids up to 4 x 4 and overlaps below half a tile for this request's latent grid."""
        if request is None:
            return super().suggest(trial, request)
        h, w = request.height // 32, request.width // 32
        rows = trial.suggest_int(f"{self.name}.rows", 1, min(4, h))
        cols = trial.suggest_int(f"{self.name}.cols", 1, min(4, w))
        if rows == cols == 1:
            return {"rows": 1, "cols": 1, "overlap": 0}
        limit = min((h + (rows - 1) * 0) // rows if rows > 1 else h, (w // cols) if cols > 1 else w) // 2
        overlap = trial.suggest_int(f"{self.name}.overlap", 0, max(0, min(32, limit)))
        return {"rows": rows, "cols": cols, "overlap": overlap}

    @staticmethod
    def _tiling(values: dict[str, Any], base: Stage2Tiling) -> Stage2Tiling:
        return Stage2Tiling(rows=values["rows"], cols=values["cols"], overlap=values["overlap"],
                            whole_frame_max_tokens=base.whole_frame_max_tokens)

    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        patch = Patch(self.name)
        patch.set_attr(pipeline, "stage2_tiling", self._tiling(values, pipeline.stage2_tiling))
        return patch
