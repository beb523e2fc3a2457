"""A tuned config's module-level techniques on ltx_pipelines' own pipeline objects (vidtune/official.py), on tiny:
bit-identical with every knob off, equal to vidtune's pipeline with the same knobs, refused where a technique needs
vidtune's seams, and the official pipeline as it was once closed."""

from __future__ import annotations

import pytest
import torch

from test_fidelity import _collect, _patch_prompts, official_env  # noqa: F401  (the official pipelines on a CPU)
from vidtune.model import ReferencePipeline, get_preset
from vidtune.model.weights import materialise_preset

KNOBS = {"kernel_choice.fp8_linear": {"layers": "feed_forward", "quantiser": "kernel"},
         "memory.chunked_ffn": {"chunk_tokens": 1024},
         "kernel_choice.sdpa_backend": {"video_self": "math", "audio_self": "off", "text_cross": "math", "a2v": "off",
                                        "v2a": "off"}}


def test_module_level_knobs_on_the_official_distilled_pipeline(official_env, tiny_models, tiny_request):
    import ltx_pipelines.distilled as official

    from vidtune.api import apply_to_official
    from vidtune.techniques import compose

    ours = ReferencePipeline(tiny_models)
    _patch_prompts(official_env, official, ours.encode_prompt(tiny_request))
    files = materialise_preset(get_preset("tiny"))
    pipe = official.DistilledPipeline(distilled_checkpoint_path=str(files.checkpoint), gemma_root=None,
                                      spatial_upsampler_path=str(files.upsampler), loras=[], device=torch.device("cpu"))
    r = tiny_request

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        return _collect(*pipe(prompt=r.prompt, seed=r.seed, height=r.height, width=r.width, num_frames=r.frames,
                              frame_rate=r.fps, images=[], tiling_config=ours.vae_tiling))

    plain = run()
    with apply_to_official(pipe, {}):
        off = run()
    assert torch.equal(off[0], plain[0]) and torch.equal(off[1], plain[1])
    with apply_to_official(pipe, KNOBS) as applied:
        first, second = run(), run()
        assert len(applied.surfaces) == 1  # the transformer built once and kept: its techniques applied once
    assert torch.equal(first[0], second[0])
    with compose(ours, KNOBS):
        mine = ours.run(r)
    assert torch.equal(first[0], mine.frames) and torch.equal(first[1], mine.audio)
    assert not torch.equal(first[0], plain[0])  # the knobs act (FP8 feed-forward changes the frames)
    again = run()  # closed: the official pipeline as it was, building its transformer at each call
    assert torch.equal(again[0], plain[0]) and "transformer" not in vars(pipe.model_ledger)

    # refused, naming the technique and the seams it needs, before the pipeline is touched
    with pytest.raises(ValueError, match=r"caching.step_skip needs vidtune's pipeline seams \(transformer.pass\)"):
        apply_to_official(pipe, {**KNOBS, "caching.step_skip": {"every": 2}})
    with pytest.raises(ValueError, match="tiling.vae_tiles needs vidtune's pipeline seams"):
        apply_to_official(pipe, {"tiling.vae_tiles": {"spatial_px": 768}})
    with pytest.raises(ValueError, match="apply_to_official: .*nope"):
        apply_to_official(pipe, {"nope.x": {"a": 1}})
    assert "transformer" not in vars(pipe.model_ledger)
    with pytest.raises(ValueError, match="not an ltx_pipelines pipeline"):
        apply_to_official(object(), KNOBS)


def test_both_ledgers_of_the_two_stage_pipeline_are_applied(official_env, tmp_path):
    """TI2VidTwoStagesPipeline holds stage 1's ledger and stage 2's (with the distilled LoRA): each transformer gets
    the knobs; a tuned config's path works as its knobs do."""
    import ltx_pipelines.ti2vid_two_stages as official
    import yaml

    from vidtune.api import apply_to_official

    files = materialise_preset(get_preset("tiny"))
    pipe = official.TI2VidTwoStagesPipeline(checkpoint_path=str(files.checkpoint), distilled_lora=[],
                                            spatial_upsampler_path=str(files.upsampler), gemma_root=None, loras=[],
                                            device=torch.device("cpu"))
    with apply_to_official(pipe, KNOBS) as applied:
        assert {id(l) for l, _ in applied._restore} == {id(pipe.stage_1_model_ledger), id(pipe.stage_2_model_ledger)}
        t1, t2 = pipe.stage_1_model_ledger.transformer(), pipe.stage_2_model_ledger.transformer()
        assert t1 is pipe.stage_1_model_ledger.transformer() and len(applied.surfaces) == 2
        assert [set(s.applied_info) >= {"memory.chunked_ffn"} for s in applied.surfaces] == [True, True]
    assert "transformer" not in vars(pipe.stage_2_model_ledger)
    config = tmp_path / "tuned.yaml"
    config.write_text(yaml.safe_dump({"vidtune_tuned_config": 1, "knobs": {"caching.step_skip": {"every": 2}},
                                      "model": {"preset": "tiny"}, "request": {}}))
    with pytest.raises(ValueError, match="caching.step_skip needs vidtune's pipeline seams"):
        apply_to_official(pipe, config)
