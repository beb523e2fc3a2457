"""Tiling family: stage-2 tiles and VAE tiles as techniques."""

from __future__ import annotations

import pytest
import torch

from vidtune.model import GenerationRequest, ReferencePipeline
from vidtune.search.metrics import psnr_db
from vidtune.techniques import KnobError, get
from vidtune.techniques.setting import check_request


def test_one_tile_equals_whole_frame(tiny_models, tiny_request, tiny_reference_output):
    pipe = ReferencePipeline(tiny_models)
    with get("tiling.stage2_tiles").apply(pipe, {"rows": 1, "cols": 1, "overlap": 0}):
        out = pipe.run(tiny_request)
    assert torch.equal(out.frames, tiny_reference_output.frames)
    assert out.stats["stage2_tiles"]["denoised_area_factor"] == 1.0


def test_more_tiles_bounded_change_and_area_factor(tiny_models):
    req = GenerationRequest(prompt="grid", seed=4, height=512, width=768, frames=9)
    whole = ReferencePipeline(tiny_models).run(req)
    results = {}
    for overlap in (2, 4):
        pipe = ReferencePipeline(tiny_models)
        with get("tiling.stage2_tiles").apply(pipe, {"rows": 2, "cols": 2, "overlap": overlap}):
            out = pipe.run(req)
        results[overlap] = (out.stats["stage2_tiles"]["denoised_area_factor"], psnr_db(whole.frames, out.frames).mean())
    # latent 16 x 24: a 2 x 2 grid with overlap o computes (8 + o/2)(12 + o/2) x 4 / 384 of the frame
    assert results[2][0] == pytest.approx((9 * 13 * 4) / 384)
    assert results[4][0] == pytest.approx((10 * 14 * 4) / 384) and results[2][0] > 1.0
    for _, psnr in results.values():
        assert 12 < psnr < 100  # changed, but bounded: the same denoising from the same upsampled latent


@pytest.mark.parametrize("values,needle", [
    ({"rows": 2, "cols": 2, "overlap": 8}, "at most half a tile"),
    ({"rows": 2, "cols": 0}, "must both be 0"),
])
def test_invalid_stage2_tiles_rejected(values, needle, tiny_request):
    with pytest.raises(KnobError, match=needle):
        check_request({"tiling.stage2_tiles": values}, tiny_request)  # latent 8 x 12: tiles of 6 x 8


def test_negative_overlap_rejected():
    with pytest.raises(KnobError, match=r"tiling.stage2_tiles.overlap must be an int in \[-1, 32\]"):
        get("tiling.stage2_tiles").validate({"overlap": -2})


def test_vae_tiles(tiny_models, tiny_request, tiny_reference_output):
    tech = get("tiling.vae_tiles")
    with pytest.raises(KnobError, match="spatial_overlap_px must be at most half of spatial_px"):
        tech.validate({"spatial_px": 128, "spatial_overlap_px": 96})
    with pytest.raises(KnobError, match="in steps of 32"):
        tech.validate({"spatial_px": 100})
    pipe = ReferencePipeline(tiny_models)
    with tech.apply(pipe, {"spatial_px": 128, "spatial_overlap_px": 32, "temporal_frames": 16,
                           "temporal_overlap_frames": 8}):
        out = pipe.run(tiny_request)
    psnr = psnr_db(tiny_reference_output.frames, out.frames).mean()
    assert 15 < psnr < 100  # decoded in 6 spatial x 2 temporal tiles: seams, not a different video
    assert torch.equal(out.audio, tiny_reference_output.audio)


def test_vae_tiles_that_cut_neither_way_change_nothing_and_a_quality_model_there_says_so():
    """VAE tiles are absolute (pixels, frames): 768 px / 128 frames cut nothing at 384x256x17, where the default
    512 px / 64 frames cut nothing either, so the setting is a no-op there (``effective`` False) though not at
    1536x1024x121; a quality model at the small request then does not measure it, and its record says so."""
    from vidtune.search.quality_model import unmeasured_on_quality_model
    from vidtune.techniques.transfer import transfer_setting

    tech = get("tiling.vae_tiles")
    big, small = GenerationRequest(height=1024, width=1536, frames=121), GenerationRequest()
    hand = {"spatial_px": 768, "spatial_overlap_px": 64, "temporal_frames": 128, "temporal_overlap_frames": 24}
    assert tech.effective(tech.validate(hand), big) and not tech.effective(tech.validate(hand), small)
    assert tech.effective(tech.validate({"spatial_px": 192}), small)  # cuts the 384 px frame
    assert tech.effective(tech.validate({"spatial_px": 768}), GenerationRequest(height=512, width=768, frames=33))
    geo = ({"depth": 48, "size": 1536, "frames": 121}, {"depth": 3, "size": 384, "frames": 17})
    mapped, notes = transfer_setting({"tiling.vae_tiles": hand}, *geo)
    assert mapped == {"tiling.vae_tiles": hand} and notes == []  # in pixels and frames, not fractions of the frame
    said = unmeasured_on_quality_model({"tiling.vae_tiles": hand}, mapped, big, small)
    assert len(said) == 1 and "tiling.vae_tiles changes nothing at the quality model's 256x384x17" in said[0]
    small_tiles = {"tiling.vae_tiles": tech.validate({"spatial_px": 192})}
    assert unmeasured_on_quality_model(small_tiles, small_tiles, big, small) == []


def test_vae_tile_sizes_are_sampled_up_to_the_video():
    """A search samples VAE tiles up to the frame's long side and frame count (a larger tile is the same one-tile
    decode under another name) and overlaps below half a tile; without a request, the knobs' whole domain."""
    import optuna

    tech = get("tiling.vae_tiles")
    req = GenerationRequest(height=1024, width=1536, frames=121)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = []
    for _ in range(60):
        v = tech.validate(tech.suggest(study.ask(), req))
        assert 128 <= v["spatial_px"] <= 1536 and 16 <= v["temporal_frames"] <= 128
        assert 2 * v["spatial_overlap_px"] <= v["spatial_px"] and 2 * v["temporal_overlap_frames"] <= v["temporal_frames"]
        seen.append(v)
    assert max(v["spatial_px"] for v in seen) > 1024 and max(v["temporal_frames"] for v in seen) > 96
    wide = [tech.suggest(study.ask()) for _ in range(100)]
    assert max(v["spatial_px"] for v in wide) > 1536 and min(v["spatial_px"] for v in wide) < 256


def test_a_vae_tile_larger_than_the_video_is_written_as_the_search_samples_it():
    """canonical: the default 512 px / 64 frames at 256x384x17 is the one-tile decode a search samples as 384 px
    / 24 frames, overlaps at most half of that; a seed config holding it lands in the study's space."""
    from vidtune.search.campaign import seed_params

    tech = get("tiling.vae_tiles")
    small = GenerationRequest()
    assert tech.canonical(tech.validate({}), small) == {"spatial_px": 384, "spatial_overlap_px": 64,
                                                        "temporal_frames": 24, "temporal_overlap_frames": 8}
    cut = tech.validate({"spatial_px": 256, "spatial_overlap_px": 32})
    assert tech.canonical(cut, small) == {**cut, "temporal_frames": 24, "temporal_overlap_frames": 8}
    params, what = seed_params("tiling", {"tiling.vae_tiles": cut}, small)
    assert params is not None and params["tiling.vae_tiles.temporal_frames"] == 24, what
