"""caching.fewer_steps: the multistep stage 1 in a fraction of its steps, optionally with the gradient-estimation
sampler, checked against ltx-pipelines' own loop on the tiny checkpoint."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from test_fidelity import _official_two_stages, _patch_prompts, official_env  # noqa: F401
from vidtune.model import GenerationRequest, ReferencePipeline
from vidtune.techniques import KnobError, compose, get
from vidtune.techniques.caching.fewer_steps import steps_for

REQUEST = GenerationRequest(prompt="a blue square", seed=3, height=256, width=384, frames=17, mode="multistep", steps=8)


def test_steps_and_refusals():
    assert [steps_for(f, 40) for f in (0.25, 0.5, 0.625, 1.0)] == [10, 20, 25, 40]
    assert steps_for(0.25, 4) == 2 and steps_for(0.25, 2) == 2
    tech = get("caching.fewer_steps")
    values = tech.validate({"fraction": 0.5})
    with pytest.raises(KnobError, match="needs request.mode=multistep"):
        tech.check_request(values, dataclasses.replace(REQUEST, mode="distilled"))
    with pytest.raises(KnobError, match="stage1_sigmas gives the schedule"):
        tech.check_request(values, dataclasses.replace(REQUEST, stage1_sigmas=(1.0, 0.5, 0.0)))
    assert not tech.applicable(dataclasses.replace(REQUEST, mode="distilled")) and tech.applicable(REQUEST)
    assert tech.effective(values, REQUEST) and not tech.effective(tech.validate({"fraction": 0.99}), REQUEST)


def test_gradient_estimation_in_fewer_steps_matches_the_official_loop(official_env, tiny_models):
    """Stage 1 with half the steps and the gradient-estimation sampler is ltx-pipelines'
    ``gradient_estimating_euler_denoising_loop`` on LTX2Scheduler's schedule of that many steps, bit for bit;
    stage 2 keeps the Euler loop. The Euler update alone in fewer steps is the official pipeline asked for fewer."""
    import ltx_pipelines.ti2vid_two_stages as official
    from ltx_pipelines.utils import gradient_estimating_euler_denoising_loop

    ours = ReferencePipeline(tiny_models)
    _patch_prompts(official_env, official, ours.encode_prompt(REQUEST))
    fewer = dataclasses.replace(REQUEST, steps=steps_for(0.5, REQUEST.steps))
    euler = official.euler_denoising_loop
    calls = []

    def stage1_ge(*args, **kwargs):  # the official two-stage pipeline's first loop is stage 1's
        calls.append(len(kwargs["sigmas"]))
        loop = gradient_estimating_euler_denoising_loop if len(calls) == 1 else euler
        return loop(*args, **{k: v for k, v in kwargs.items()}, **({"ge_gamma": 2.5} if len(calls) == 1 else {}))

    official_env.setattr(official, "euler_denoising_loop", stage1_ge)
    frames, audio = _official_two_stages(official, fewer, tiny_models.stg_blocks, ours.vae_tiling, distilled_lora=[])
    assert calls == [fewer.steps + 1, 4]
    knobs = {"caching.fewer_steps": {"fraction": 0.5, "sampler": "gradient_estimation", "gamma": 2.5}}
    with compose(ours, knobs):
        out = ours.run(REQUEST)
    assert out.stats["stage1.passes"] == 4 * fewer.steps
    assert torch.equal(out.frames, frames) and torch.equal(out.audio, audio)
    official_env.setattr(official, "euler_denoising_loop", euler)

    # the Euler update in fewer steps: the official pipeline asked for that many steps
    frames, audio = _official_two_stages(official, fewer, tiny_models.stg_blocks, ours.vae_tiling, distilled_lora=[])
    with compose(ours, {"caching.fewer_steps": {"fraction": 0.5}}):
        out = ours.run(REQUEST)
    assert torch.equal(out.frames, frames) and torch.equal(out.audio, audio)
    # and off: the request's own steps (the Euler loop's arithmetic untouched)
    full = ours.run(REQUEST)
    assert full.stats["stage1.passes"] == 4 * REQUEST.steps and not torch.equal(full.frames, out.frames)
