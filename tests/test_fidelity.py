"""The reference pipeline reproduces ltx_pipelines' own pipelines bit for bit on the tiny checkpoint."""

from __future__ import annotations

import pytest
import torch

from vidtune.model import GenerationRequest, ReferencePipeline, get_preset
from vidtune.model.weights import materialise_preset


@pytest.fixture()
def official_env(monkeypatch):
    """The official pipelines on a CPU: no-op CUDA syncs, and the prompt encoder replaced by our contexts.

    ltx_pipelines calls torch.cuda.synchronize() unconditionally (ENVIRONMENT.md) and has no text path
    without the 12B Gemma; both are replaced by what our pipeline feeds the same transformer.
    """
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda *a, **k: None)
    return monkeypatch


def _patch_prompts(monkeypatch, module, contexts):
    from ltx_core.text_encoders.gemma.embeddings_processor import EmbeddingsProcessorOutput

    def fake_encode(prompts, ledger, **kwargs):
        out = [EmbeddingsProcessorOutput(contexts.video, contexts.audio, None)]
        if len(prompts) > 1:
            out.append(EmbeddingsProcessorOutput(contexts.negative_video, contexts.negative_audio, None))
        return out

    monkeypatch.setattr(module, "encode_prompts", fake_encode)


def _collect(video_iter, audio):
    frames = torch.cat(list(video_iter), dim=0)
    return frames, audio.waveform.float()


def test_distilled_matches_official(official_env, tiny_models, tiny_request):
    import ltx_pipelines.distilled as official

    ours = ReferencePipeline(tiny_models)
    ctx = ours.encode_prompt(tiny_request)
    _patch_prompts(official_env, official, ctx)
    files = materialise_preset(get_preset("tiny"))
    pipe = official.DistilledPipeline(
        distilled_checkpoint_path=str(files.checkpoint), gemma_root=None, spatial_upsampler_path=str(files.upsampler),
        loras=[], device=torch.device("cpu"),
    )
    r = tiny_request
    frames, audio = _collect(*pipe(prompt=r.prompt, seed=r.seed, height=r.height, width=r.width, num_frames=r.frames,
                                   frame_rate=r.fps, images=[], tiling_config=ours.vae_tiling))
    out = ours.run(r)
    assert out.frames.shape == (r.frames, r.height, r.width, 3)
    assert torch.equal(out.frames, frames)
    assert torch.equal(out.audio, audio)


def test_multistep_matches_official_two_stages(official_env, tiny_models):
    import ltx_pipelines.ti2vid_two_stages as official
    from ltx_core.components.guiders import MultiModalGuiderParams

    r = GenerationRequest(prompt="a blue square", seed=3, height=256, width=384, frames=17, mode="multistep", steps=4)
    ours = ReferencePipeline(tiny_models)
    ctx = ours.encode_prompt(r)
    _patch_prompts(official_env, official, ctx)
    files = materialise_preset(get_preset("tiny"))
    pipe = official.TI2VidTwoStagesPipeline(
        checkpoint_path=str(files.checkpoint), distilled_lora=[], spatial_upsampler_path=str(files.upsampler),
        gemma_root=None, loras=[], device=torch.device("cpu"),
    )
    stg = list(tiny_models.stg_blocks)
    vparams = MultiModalGuiderParams(cfg_scale=r.cfg_scale, stg_scale=r.stg_scale, rescale_scale=r.rescale_scale,
                                     modality_scale=r.modality_scale, skip_step=0, stg_blocks=stg)
    aparams = MultiModalGuiderParams(cfg_scale=r.audio_cfg_scale, stg_scale=r.stg_scale, rescale_scale=r.rescale_scale,
                                     modality_scale=r.modality_scale, skip_step=0, stg_blocks=stg)
    frames, audio = _collect(*pipe(prompt=r.prompt, negative_prompt="neg", seed=r.seed, height=r.height, width=r.width,
                                   num_frames=r.frames, frame_rate=r.fps, num_inference_steps=r.steps,
                                   video_guider_params=vparams, audio_guider_params=aparams, images=[],
                                   tiling_config=ours.vae_tiling))
    out = ours.run(r)
    # every guided step runs the four official passes (cond, CFG, STG, modality) as separate passes
    assert out.stats["stage1.passes"] == 4 * r.steps
    assert torch.equal(out.frames, frames)
    assert torch.equal(out.audio, audio)
