"""The reference pipeline reproduces ltx_pipelines' own pipelines bit for bit on the tiny checkpoint."""

from __future__ import annotations

import pytest
import torch

from vidtune.model import GenerationRequest, ReferencePipeline, get_preset
from vidtune.model.weights import materialise_preset


@pytest.fixture()
def official_env(monkeypatch):
    """The official pipelines on a CPU: no-op CUDA syncs, and the prompt encoder replaced by our contexts.

    ltx_pipelines calls torch.cuda.synchronize() unconditionally (docs/environment.md) and has no text path
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


def _official_two_stages(official, r, stg_blocks, tiling, distilled_lora):
    """Frames and audio of ``TI2VidTwoStagesPipeline`` on the tiny checkpoint for request ``r``."""
    from ltx_core.components.guiders import MultiModalGuiderParams

    files = materialise_preset(get_preset("tiny"))
    pipe = official.TI2VidTwoStagesPipeline(
        checkpoint_path=str(files.checkpoint), distilled_lora=distilled_lora, spatial_upsampler_path=str(files.upsampler),
        gemma_root=None, loras=[], device=torch.device("cpu"),
    )
    stg = list(stg_blocks)
    vparams = MultiModalGuiderParams(cfg_scale=r.cfg_scale, stg_scale=r.stg_scale, rescale_scale=r.rescale_scale,
                                     modality_scale=r.modality_scale, skip_step=0, stg_blocks=stg)
    aparams = MultiModalGuiderParams(cfg_scale=r.audio_cfg_scale, stg_scale=r.stg_scale, rescale_scale=r.rescale_scale,
                                     modality_scale=r.modality_scale, skip_step=0, stg_blocks=stg)
    return _collect(*pipe(prompt=r.prompt, negative_prompt="neg", seed=r.seed, height=r.height, width=r.width,
                          num_frames=r.frames, frame_rate=r.fps, num_inference_steps=r.steps,
                          video_guider_params=vparams, audio_guider_params=aparams, images=[], tiling_config=tiling))


def test_multistep_matches_official_two_stages(official_env, tiny_models):
    import ltx_pipelines.ti2vid_two_stages as official

    r = GenerationRequest(prompt="a blue square", seed=3, height=256, width=384, frames=17, mode="multistep", steps=4)
    ours = ReferencePipeline(tiny_models)
    ctx = ours.encode_prompt(r)
    _patch_prompts(official_env, official, ctx)
    frames, audio = _official_two_stages(official, r, tiny_models.stg_blocks, ours.vae_tiling, distilled_lora=[])
    out = ours.run(r)
    # every guided step runs the four official passes (cond, CFG, STG, modality) as separate passes
    assert out.stats["stage1.passes"] == 4 * r.steps
    assert torch.equal(out.frames, frames)
    assert torch.equal(out.audio, audio)


def _make_lora(path, transformer, rank: int = 2, seed: int = 0, scale: float = 0.05):
    """A small LoRA for the tiny transformer in the released key layout (``diffusion_model.`` prefix):
    every block's video self-attention query and feed-forward output."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for i, block in enumerate(transformer.velocity_model.transformer_blocks):
        for name, lin in (("attn1.to_q", block.attn1.to_q), ("ff.net.2", block.ff.net[2])):
            out_f, in_f = lin.weight.shape
            key = f"diffusion_model.transformer_blocks.{i}.{name}"
            tensors[f"{key}.lora_A.weight"] = (torch.randn(rank, in_f, generator=g) * scale).bfloat16()
            tensors[f"{key}.lora_B.weight"] = (torch.randn(out_f, rank, generator=g) * scale).bfloat16()
    save_file(tensors, str(path))
    return path


def test_multistep_with_distilled_lora_matches_official_two_stages(official_env, tiny_models, tmp_path):
    """model=checkpoint with model.distilled_lora is the official two-stage pipeline as released: stage 2
    runs the checkpoint with the distilled LoRA fused (ltx-core's loader), bit for bit."""
    import ltx_pipelines.ti2vid_two_stages as official
    from ltx_core.loader import LTXV_LORA_COMFY_RENAMING_MAP, LoraPathStrengthAndSDOps

    from vidtune.model import ModelSource, load_models

    files = materialise_preset(get_preset("tiny"))
    lora = _make_lora(tmp_path / "distilled_lora.safetensors", tiny_models.transformer)
    source = ModelSource(preset=None, checkpoint=str(files.checkpoint), upsampler=str(files.upsampler),
                         stg_blocks=tiny_models.stg_blocks, distilled_lora=str(lora), distilled_lora_strength=0.8)
    models = load_models(source)
    assert models.stage2_transformer is not None and models.stage2_transformer is not models.transformer
    r = GenerationRequest(prompt="a blue square", seed=3, height=256, width=384, frames=17, mode="multistep", steps=4)
    ours = ReferencePipeline(models)
    ctx = ours.encode_prompt(r)
    _patch_prompts(official_env, official, ctx)
    frames, audio = _official_two_stages(
        official, r, models.stg_blocks, ours.vae_tiling,
        distilled_lora=[LoraPathStrengthAndSDOps(str(lora), 0.8, LTXV_LORA_COMFY_RENAMING_MAP)])
    out = ours.run(r)
    assert torch.equal(out.frames, frames)
    assert torch.equal(out.audio, audio)
    # the LoRA changed stage 2 (a pipeline that ignored it would give other frames) and only stage 2
    plain = ReferencePipeline(load_models(ModelSource(preset=None, checkpoint=str(files.checkpoint),
                                                      upsampler=str(files.upsampler), stg_blocks=models.stg_blocks)))
    without = plain.run(r)
    assert torch.equal(without.stage1.video, out.stage1.video) and not torch.equal(without.frames, out.frames)
    # parameters the LoRA leaves alone are shared, not copied
    s1 = dict(models.transformer.named_parameters())
    s2 = dict(models.stage2_transformer.named_parameters())
    shared = [n for n in s1 if s1[n].data_ptr() == s2[n].data_ptr()]
    assert "velocity_model.transformer_blocks.0.attn1.to_k.weight" in shared
    assert "velocity_model.transformer_blocks.0.attn1.to_q.weight" not in shared


def test_distilled_lora_that_does_not_match_is_a_clear_error(tmp_path):
    from safetensors.torch import save_file

    from vidtune.model import ModelSource

    files = materialise_preset(get_preset("tiny"))
    base = dict(preset=None, checkpoint=str(files.checkpoint), upsampler=str(files.upsampler))
    with pytest.raises(ValueError, match="model.distilled_lora must be an existing"):
        ModelSource(**base, distilled_lora=str(tmp_path / "missing.safetensors"))
    with pytest.raises(ValueError, match="needs model=checkpoint"):
        ModelSource(preset="tiny", distilled_lora=str(files.checkpoint))
    wrong_shape = tmp_path / "other_model.safetensors"  # a LoRA made for a wider model
    save_file({"diffusion_model.transformer_blocks.0.attn1.to_q.lora_A.weight": torch.zeros(2, 4096).bfloat16(),
               "diffusion_model.transformer_blocks.0.attn1.to_q.lora_B.weight": torch.zeros(4096, 2).bfloat16()},
              str(wrong_shape))
    with pytest.raises(ValueError, match="does not match the checkpoint: transformer_blocks.0.attn1.to_q is"):
        ModelSource(**base, distilled_lora=str(wrong_shape))
    wrong_layer = tmp_path / "other_layers.safetensors"
    save_file({"diffusion_model.transformer_blocks.99.attn1.to_q.lora_A.weight": torch.zeros(2, 8).bfloat16(),
               "diffusion_model.transformer_blocks.99.attn1.to_q.lora_B.weight": torch.zeros(8, 2).bfloat16()},
              str(wrong_layer))
    with pytest.raises(ValueError, match="targets transformer_blocks.99.attn1.to_q.weight"):
        ModelSource(**base, distilled_lora=str(wrong_layer))
    not_lora = tmp_path / "not_a_lora.safetensors"
    save_file({"x": torch.zeros(2)}, str(not_lora))
    with pytest.raises(ValueError, match="holds no LoRA pairs"):
        ModelSource(**base, distilled_lora=str(not_lora))
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="model.distilled_lora=.* is not a readable safetensors file"):
        ModelSource(**base, distilled_lora=str(garbage))


def test_cli_refuses_a_lora_for_another_model_before_any_work(tmp_path, capsys):
    from safetensors.torch import save_file

    from vidtune.cli import main

    files = materialise_preset(get_preset("tiny"))
    lora = tmp_path / "other_model.safetensors"
    save_file({"diffusion_model.transformer_blocks.0.attn1.to_q.lora_A.weight": torch.zeros(2, 4096).bfloat16(),
               "diffusion_model.transformer_blocks.0.attn1.to_q.lora_B.weight": torch.zeros(4096, 2).bfloat16()},
              str(lora))
    code = main(["generate", "model=checkpoint", f"model.checkpoint={files.checkpoint}", f"model.upsampler={files.upsampler}",
                 f"model.distilled_lora={lora}", f"results_dir={tmp_path}", "request.mode=multistep"])
    assert code == 2
    assert "does not match the checkpoint" in capsys.readouterr().err
    assert not any(tmp_path.glob("*/*.mp4"))
