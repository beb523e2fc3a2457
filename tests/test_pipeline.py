"""Reference pipeline behaviour on the tiny preset: determinism, stage reuse, checkpoints, tiles."""

from __future__ import annotations

import pytest
import torch

from vidtune.model import GenerationRequest, Models, ReferencePipeline, Stage2Tiling, get_preset
from vidtune.model.loading import load_models, ModelSource
from vidtune.model.tiles import axis_intervals, blend_weights, plan_tiles
from vidtune.model.weights import build_random_component, save_checkpoint
from vidtune.search.metrics import psnr_db


def test_deterministic_twice(tiny_models, tiny_request, tiny_reference_output):
    again = ReferencePipeline(tiny_models).run(tiny_request)
    assert torch.equal(again.frames, tiny_reference_output.frames)
    assert torch.equal(again.audio, tiny_reference_output.audio)


def test_output_shapes_and_noise_visible(tiny_reference_output, tiny_request):
    out = tiny_reference_output
    assert out.frames.dtype == torch.uint8 and out.frames.shape == (17, 256, 384, 3)
    assert out.audio.dtype == torch.float32 and out.audio.shape[0] == 2 and out.sample_rate == 24000
    # ~0.71 s of audio for 17 frames at 24 fps (the audio latent rounds up to whole latent frames)
    assert abs(out.audio.shape[1] / out.sample_rate - 17 / 24) < 0.05
    # random weights at init_std 0.2 must not give a flat picture (knobs would look free)
    assert out.frames.float().std() > 20


def test_seed_changes_output(tiny_models, tiny_request, tiny_reference_output):
    from dataclasses import replace

    other = ReferencePipeline(tiny_models).run(replace(tiny_request, seed=tiny_request.seed + 1))
    assert not torch.equal(other.frames, tiny_reference_output.frames)


def test_stage_reuse_equals_full_run(tiny_models, tiny_request, tiny_reference_output):
    ref = tiny_reference_output
    pipe = ReferencePipeline(tiny_models)
    # restart stage 2 from the stored stage-1 output (latents + generator state)
    s1 = ref.stage1
    up = pipe.upsample(s1.video.clone())
    assert torch.equal(up, ref.upsampled)
    s2 = pipe.stage2(tiny_request, up, s1.audio.clone(), s1.rng_state.clone())
    assert torch.equal(s2.video, ref.stage2.video) and torch.equal(s2.audio, ref.stage2.audio)
    frames = pipe.decode_video(s2.video, s2.rng_state)
    audio, sr = pipe.decode_audio(s2.audio)
    assert torch.equal(frames, ref.frames) and torch.equal(audio, ref.audio) and sr == ref.sample_rate


def test_checkpoint_round_trip(tmp_path, tiny_request):
    """Components built in memory == the same components saved in LTX-2 layout and loaded by ModelLedger."""
    from ltx_core.model.transformer import X0Model

    preset = get_preset("tiny")
    parts = {n: build_random_component(preset, n, dtype=torch.bfloat16)
             for n in ("transformer", "video_encoder", "video_decoder", "audio_decoder", "vocoder", "upsampler")}
    in_memory = Models(transformer=X0Model(parts["transformer"]).eval(), video_encoder=parts["video_encoder"],
                       video_decoder=parts["video_decoder"], audio_decoder=parts["audio_decoder"],
                       vocoder=parts["vocoder"], upsampler=parts["upsampler"], stg_blocks=preset.stg_blocks,
                       context_tokens=64)
    files = save_checkpoint(parts, preset.config, preset.upsampler_config, tmp_path / "ckpt")
    from safetensors import safe_open

    with safe_open(str(files.checkpoint), framework="pt") as f:
        keys = list(f.keys())
        assert "config" in (f.metadata() or {})
    for prefix in ("model.diffusion_model.", "vae.decoder.", "vae.encoder.", "vae.per_channel_statistics.",
                   "audio_vae.decoder.", "vocoder."):
        assert any(k.startswith(prefix) for k in keys), prefix
    loaded = load_models(ModelSource(preset=None, checkpoint=str(files.checkpoint), upsampler=str(files.upsampler),
                                     stg_blocks=preset.stg_blocks))
    loaded.context_tokens = 64
    a = ReferencePipeline(in_memory).run(tiny_request)
    b = ReferencePipeline(loaded).run(tiny_request)
    assert torch.equal(a.frames, b.frames) and torch.equal(a.audio, b.audio)


def test_explicit_single_tile_equals_default(tiny_models, tiny_request, tiny_reference_output):
    out = ReferencePipeline(tiny_models, stage2_tiling=Stage2Tiling(rows=1, cols=1, overlap=0)).run(tiny_request)
    assert out.stats["stage2_tiles"]["denoised_area_factor"] == 1.0
    assert torch.equal(out.frames, tiny_reference_output.frames)


def test_tiled_stage2_changes_output_by_a_bounded_amount(tiny_models):
    req = GenerationRequest(prompt="tiles", seed=1, height=512, width=512, frames=9)
    whole = ReferencePipeline(tiny_models).run(req)
    tiled = ReferencePipeline(tiny_models, stage2_tiling=Stage2Tiling(rows=2, cols=2, overlap=4)).run(req)
    assert tiled.stats["stage2.passes"] == 3 * 4  # 3 steps x 4 tiles
    assert tiled.stats["stage2_tiles"]["denoised_area_factor"] > 1.0
    psnr = psnr_db(whole.frames, tiled.frames).mean()
    # Tiles see less context and re-based positions, so the output changes, but it is the same
    # denoising of the same upsampled latent: random-weight tiny stays well above noise-vs-noise
    # (two unrelated tiny videos score about 7-9 dB).
    assert 12.0 < psnr < 100.0


def test_blend_weights_partition_of_unity():
    for h, w, r, c, o in [(16, 24, 2, 3, 3), (68, 120, 2, 4, 8), (10, 10, 1, 1, 0), (33, 17, 3, 2, 2)]:
        tiles = plan_tiles(h, w, r, c, o)
        assert len(tiles) == r * c
        total = blend_weights(h, w, tiles)
        assert torch.allclose(total, torch.ones(h, w), atol=1e-6)
        assert all(bool((t.weight > 0).all()) for t in tiles)


@pytest.mark.parametrize("overlap", [-1, 9])
def test_invalid_tile_overlap_rejected(overlap):
    with pytest.raises(ValueError, match="overlap"):
        axis_intervals(16, 2, overlap)


def test_auto_tiling_whole_frame_below_threshold_grid_above():
    t = Stage2Tiling()
    assert t.resolve(16, 32, 48)[:2] == (1, 1)  # 24,576 tokens (1536x1024x121) -> whole frame
    rows, cols, overlap = t.resolve(16, 68, 120)  # 4K: 130,560 tokens -> a grid
    assert rows * cols >= 4 and overlap > 0


def test_a_random_transformer_built_in_bf16_holds_the_float32_values_rounded():
    """The random transformer is materialised in its dtype (an 80 GB card could not hold the 19B in float32
    first): its bf16 weights are exactly the float32 build's, rounded."""
    from vidtune.model.presets import PRESETS

    preset = PRESETS["tiny"]
    low = build_random_component(preset, "transformer", dtype=torch.bfloat16).state_dict()
    full = build_random_component(preset, "transformer", dtype=torch.float32).state_dict()
    assert {t.dtype for t in low.values() if t.is_floating_point()} == {torch.bfloat16}
    assert all(torch.equal(low[k], full[k].to(low[k].dtype)) for k in full)
    assert any(full[k].ndim == 2 and not torch.equal(full[k], low[k].float()) for k in full)  # (really rounded)


def test_stage_steps_match_the_official_distilled_schedules():
    """``stage_steps`` writes the distilled schedules' step counts instead of importing ltx-pipelines (whose
    package import costs seconds in the campaign's driver): they must be the package's own."""
    from ltx_pipelines.utils.constants import DISTILLED_SIGMA_VALUES, STAGE_2_DISTILLED_SIGMA_VALUES

    from vidtune.model.generation import stage_steps

    steps = stage_steps(GenerationRequest(prompt="x", height=128, width=192, frames=9))
    assert steps == {"stage1": len(DISTILLED_SIGMA_VALUES) - 1, "stage2": len(STAGE_2_DISTILLED_SIGMA_VALUES) - 1}
    multistep = GenerationRequest(prompt="x", height=128, width=192, frames=9, mode="multistep", steps=12)
    assert stage_steps(multistep)["stage1"] == 12


def test_the_cli_and_the_campaign_driver_import_no_model_code():
    """``vidtune --help``, bad input, a campaign's driver and its sampling do not import ltx-pipelines or
    transformers (4 of the 7 s of every CLI start on a 2-core CPU; the actors import them, where the model runs)."""
    code = ("import sys\n"
            "from vidtune.cli import _parser\n"
            "import vidtune.driver, vidtune.settings, vidtune.search.sampling, vidtune.search.probes\n"
            "import vidtune.integrator.report, vidtune.techniques\n"
            "from vidtune.techniques import get\n"
            "from vidtune.model import GenerationRequest\n"
            "r = GenerationRequest(prompt='x', height=128, width=192, frames=9)\n"
            "assert get('caching.first_block').effective({'warmup_steps': 0}, r)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ltx_pipelines', 'transformers')))\n")
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
    # the lazy names are listed and load on first use; an unknown one is an AttributeError
    import vidtune.model as model
    import vidtune.search as search

    assert {"ReferencePipeline", "STAGES"} <= set(dir(model)) and "evaluate" in dir(search)
    assert model.ReferencePipeline is ReferencePipeline and search.psnr_db.__module__ == "vidtune.search.metrics"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        model.nope  # noqa: B018
