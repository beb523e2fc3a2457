"""Video VAE decode tiles: spatial tile size and overlap (pixels), temporal tile size and overlap (frames).

Off is the official ``TilingConfig.default()`` (512 px / 64 px overlap, 64 frames / 24 overlap). ltx-core
requires spatial sizes in multiples of 32 (>= 64) and temporal sizes in multiples of 8 (>= 16).

The sizes are absolute: mapped to another request or model (the quality model, a seed config) they stay in
pixels and frames. What a tile seam costs depends on the decoder's receptive field, which is in pixels, not
on the frame's size: scaled with the frame, the setting 768 px / 128 frames of a 1536 px wide, 121-frame
campaign became 192 px / 16 frames at the quality model's 384 px wide, 17 frames and scored 28.0 dB there on
the H200 (34.5 dB on a CPU) against the untiled baseline (campaign h200-19b-1536d, resumed), while on ltx2-mini
768 px wide, 33 frames, where the default 512 px tiles cut the frame as they do at 1536 px, the same 768 px /
128 frames scored 52.5 dB (results/benchmarks/whole_generation/README.md).
"""

from __future__ import annotations

from typing import Any

from vidtune.techniques.registry import Knob, KnobError, Patch, Technique, register


@register("tiling.vae_tiles")
class VAETiles(Technique):
    """Choose the video VAE's decode tiling."""

    knobs = (
        Knob("spatial_px", "int", off=512, low=64, high=2048, step=32, help="spatial tile size in pixels"),
        Knob("spatial_overlap_px", "int", off=64, low=0, high=512, step=32, help="spatial overlap in pixels"),
        Knob("temporal_frames", "int", off=64, low=16, high=256, step=8, help="temporal tile size in frames"),
        Knob("temporal_overlap_frames", "int", off=24, low=0, high=128, step=8, help="temporal overlap in frames"),
    )
    stages = ("decode_video",)
    seams = ("vae.tiles",)
    description = "video VAE decode tile sizes and overlaps (ltx-core tiled decoding)"

    def check(self, values: dict[str, Any]) -> None:
        if values["spatial_overlap_px"] * 2 > values["spatial_px"]:
            raise KnobError(f"{self.name}.spatial_overlap_px must be at most half of spatial_px "
                            f"({values['spatial_px'] // 2}), got {values['spatial_overlap_px']}")
        if values["temporal_overlap_frames"] * 2 > values["temporal_frames"]:
            raise KnobError(f"{self.name}.temporal_overlap_frames must be at most half of temporal_frames "
                            f"({values['temporal_frames'] // 2}), got {values['temporal_overlap_frames']}")

    def neutral(self, request: Any, device: Any) -> dict[str, Any] | None:
        # tiles larger than the video: one tile either way, as with the default when it covers the video
        if max(request.height, request.width) > 512 or request.frames > 64:
            return None
        return {"spatial_px": 1024, "spatial_overlap_px": 64, "temporal_frames": 128, "temporal_overlap_frames": 24}

    inexact = "tile seams are blended differently by any tile size that cuts the video (neutral only for videos of one tile)"

    def canonical(self, values: dict[str, Any], request: Any) -> dict[str, Any]:
        """A tile at least as large as the video (long side; frame count) is the one-tile decode a search samples
        as the video's own size, rounded up to the grid; its overlap, which then blends nothing, at most half of
        it (the default's 64 frames at 17 frames are 24, its 24-frame overlap 8)."""
        out = dict(values)
        side = -(-max(request.height, request.width) // 32) * 32
        if out["spatial_px"] >= side:
            out["spatial_px"] = max(64, side)
            out["spatial_overlap_px"] = min(out["spatial_overlap_px"], out["spatial_px"] // 2 // 32 * 32)
        frames = -(-request.frames // 8) * 8
        if out["temporal_frames"] >= frames:
            out["temporal_frames"] = max(16, frames)
            out["temporal_overlap_frames"] = min(out["temporal_overlap_frames"], out["temporal_frames"] // 2 // 8 * 8)
        return out

    def effective(self, values: dict[str, Any], request: Any) -> bool:
        """False when neither this setting nor the default cuts the request's video (one tile either way: the
        same decode), e.g. 768 px tiles at the quality model's 384x256x17."""
        def one_tile(v: dict[str, Any]) -> bool:
            return v["spatial_px"] >= max(request.height, request.width) and v["temporal_frames"] >= request.frames

        return not (one_tile(values) and one_tile(self.off_values()))

    def suggest(self, trial: Any, request: Any = None) -> dict[str, Any]:
        """Tile sizes first, then overlaps below half a tile (the constraint ``check`` enforces). For a request,
        sizes up to its frame's long side and its frame count (rounded up to the grid): any larger tile decodes
        the video in one tile, as that one does, so a search would measure the same decode under other names;
        spatial sizes from 128 px (the 1536 px campaign's 256 px tiles were already 14% slower than the default's
        512 on the H200: smaller ones only add seams)."""
        n = self.name
        hi_s, hi_t, lo_s = 2048, 256, 64
        if request is not None:
            hi_s = min(2048, max(64, -(-max(request.height, request.width) // 32) * 32))
            hi_t = min(256, max(16, -(-request.frames // 8) * 8))
            lo_s = min(128, hi_s)
        spatial = trial.suggest_int(f"{n}.spatial_px", lo_s, hi_s, step=32)
        temporal = trial.suggest_int(f"{n}.temporal_frames", 16, hi_t, step=8)
        return {
            "spatial_px": spatial,
            "spatial_overlap_px": trial.suggest_int(f"{n}.spatial_overlap_px", 0, min(512, spatial // 2 // 32 * 32), step=32),
            "temporal_frames": temporal,
            "temporal_overlap_frames": trial.suggest_int(f"{n}.temporal_overlap_frames", 0, min(128, temporal // 2 // 8 * 8), step=8),
        }

    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        from ltx_core.model.video_vae import SpatialTilingConfig, TemporalTilingConfig, TilingConfig

        config = TilingConfig(
            spatial_config=SpatialTilingConfig(values["spatial_px"], values["spatial_overlap_px"]),
            temporal_config=TemporalTilingConfig(values["temporal_frames"], values["temporal_overlap_frames"]),
        )
        patch = Patch(self.name)
        patch.set_attr(pipeline, "vae_tiling", config)
        return patch
