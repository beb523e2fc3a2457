"""Caching family: pass accounting, threshold extremes, and equality with a hand-computed reuse."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from vidtune.model import GenerationRequest, ReferencePipeline
from vidtune.techniques import CompositionError, compose, get
from vidtune.techniques.caching.step_skip import skip_mask
from vidtune.search.metrics import psnr_db


def _run(models, request, name, values, *, bypass_domain=False):
    pipe = ReferencePipeline(models)
    tech = get(name)
    patch = tech.apply_active(pipe, {**tech.off_values(), **values}) if bypass_domain else tech.apply(pipe, values)
    with patch:
        out = pipe.run(request)
    return out


def test_first_block_threshold_zero_computes_every_pass(tiny_models, tiny_request, tiny_reference_output):
    out = _run(tiny_models, tiny_request, "caching.first_block", {"threshold": 0.0, "fn_blocks": 2, "warmup_steps": 0})
    rec = out.stats["caching.first_block"]
    assert rec == {"stage1": {"computed": 8, "cached": 0}, "stage2": {"computed": 3, "cached": 0}}
    assert torch.equal(out.frames, tiny_reference_output.frames)


def test_first_block_huge_threshold_caches_all_but_warmup_and_last(tiny_models, tiny_request, tiny_reference_output):
    out = _run(tiny_models, tiny_request, "caching.first_block",
               {"threshold": 1e9, "warmup_steps": 1, "max_consecutive": 8}, bypass_domain=True)
    rec = out.stats["caching.first_block"]
    assert rec == {"stage1": {"computed": 2, "cached": 6}, "stage2": {"computed": 2, "cached": 1}}
    assert not torch.equal(out.frames, tiny_reference_output.frames)


def test_first_block_equals_hand_computed_reuse(tiny_models, tiny_request):
    """With every cacheable step cached, the output equals an independent hand-written reuse."""
    fn = 1
    cached = _run(tiny_models, tiny_request, "caching.first_block",
                  {"threshold": 1e9, "warmup_steps": 1, "max_consecutive": 8, "fn_blocks": fn}, bypass_domain=True)
    schedule = {"stage1": set(range(1, 7)), "stage2": {1}}
    pipe = ReferencePipeline(tiny_models)
    vm = pipe.models.transformer.velocity_model
    blocks = vm.transformer_blocks
    store = {}

    def process(video, audio, perturbations):
        ctx = pipe.context
        key = (ctx.stage, ctx.pass_name, ctx.tile)
        v1, a1 = video, audio
        for b in blocks[:fn]:
            v1, a1 = b(video=v1, audio=a1, perturbations=perturbations)
        if ctx.step in schedule[ctx.stage]:
            rv, ra = store[key]
            return replace(v1, x=v1.x + rv), replace(a1, x=a1.x + ra)
        v, a = v1, a1
        for b in blocks[fn:]:
            v, a = b(video=v, audio=a, perturbations=perturbations)
        store[key] = (v.x - v1.x, a.x - a1.x)
        return v, a

    vm._process_transformer_blocks = process
    try:
        hand = pipe.run(tiny_request)
    finally:
        del vm._process_transformer_blocks
    assert torch.equal(cached.frames, hand.frames) and torch.equal(cached.audio, hand.audio)


def test_cache_state_is_per_guidance_pass(tiny_models):
    r = GenerationRequest(prompt="passes", seed=2, mode="multistep", steps=6)
    out = _run(tiny_models, r, "caching.first_block", {"threshold": 1e9, "warmup_steps": 2, "max_consecutive": 8},
               bypass_domain=True)
    s1 = out.stats["caching.first_block"]["stage1"]
    assert s1["computed"] + s1["cached"] == 4 * 6  # cond, uncond, STG, modality passes each step
    # per pass: steps 0, 1 (warm-up) and 5 (last) computed, 2..4 cached -> 3 computed x 4 passes
    assert s1 == {"computed": 12, "cached": 12}


def test_teacache_extremes(tiny_models, tiny_request, tiny_reference_output):
    off = _run(tiny_models, tiny_request, "caching.teacache", {"threshold": 0.0, "first_kept": 2})
    assert off.stats["caching.teacache"]["stage1"] == {"computed": 8, "cached": 0}
    assert torch.equal(off.frames, tiny_reference_output.frames)
    on = _run(tiny_models, tiny_request, "caching.teacache", {"threshold": 1e9, "first_kept": 1, "last_kept": 1},
              bypass_domain=True)
    assert on.stats["caching.teacache"]["stage1"] == {"computed": 2, "cached": 6}
    assert on.stats["caching.teacache"]["stage2"] == {"computed": 2, "cached": 1}


def test_teacache_moderate_threshold_is_between(tiny_models, tiny_request, tiny_reference_output):
    out = _run(tiny_models, tiny_request, "caching.teacache", {"threshold": 0.3})
    rec = out.stats["caching.teacache"]["stage1"]
    assert rec["computed"] + rec["cached"] == 8
    if rec["cached"]:
        assert not torch.equal(out.frames, tiny_reference_output.frames)


def test_step_skip_mask_and_output(tiny_models, tiny_request, tiny_reference_output):
    assert skip_mask(8, 2, 1, 1) == [False, False, True, False, True, False, True, False]
    assert skip_mask(8, 0, 1, 1) == [False] * 8
    out = _run(tiny_models, tiny_request, "caching.step_skip", {"every": 2})
    assert out.stats["caching.step_skip"]["stage1"] == {"computed": 5, "cached": 3}
    psnr = psnr_db(tiny_reference_output.frames, out.frames).mean()
    assert 10 < psnr < 100  # changed, but the same video (unrelated tiny videos: 7-9 dB)


def test_block_caches_conflict(tiny_models):
    pipe = ReferencePipeline(tiny_models)
    with pytest.raises(CompositionError, match="transformer.blocks"):
        compose(pipe, {"caching.first_block": {"threshold": 0.1}, "caching.teacache": {"threshold": 0.1}})
    with compose(pipe, {"caching.first_block": {"threshold": 0.1}, "caching.step_skip": {"every": 2}}) as patch:
        assert [p.label for p in patch.parts] == ["caching.first_block", "caching.step_skip"]


@pytest.mark.parametrize("name,values", [
    ("caching.first_block", {"threshold": 0.2}),
    ("caching.teacache", {"threshold": 0.3}),
])
def test_a_cache_reads_the_device_at_most_once_per_pass(name, values, tiny_models, tiny_request, monkeypatch):
    """Host reads (``.item()``, ``.tolist()``, ``float()`` of a tensor) that vidtune makes in stage 1: the
    sigma list once, then at most one per transformer pass (the cache's reduced statistic), so a GPU waits
    once per step. (ltx-core's Euler step reads each sigma with ``.item()`` itself: not counted.)"""
    import sys

    reads = []

    def counting(method):
        real = getattr(torch.Tensor, method)

        def read(self, *a, **k):
            if "ltx_core" not in sys._getframe(1).f_code.co_filename:
                reads.append(f"{method} at {sys._getframe(1).f_code.co_filename}:{sys._getframe(1).f_lineno}")
            return real(self, *a, **k)

        return read

    for method in ("item", "tolist", "__float__"):
        monkeypatch.setattr(torch.Tensor, method, counting(method))
    pipe = ReferencePipeline(tiny_models)
    with get(name).apply(pipe, values):
        reads.clear()
        pipe.stage1(tiny_request)
    passes = pipe.stats["stage1.passes"]
    assert passes == 8 and len(reads) <= passes + 1, reads


def _guided_passes_recorded(models, request, setting):
    """Run ``request`` under ``setting``; returns (output, what the transformer computed, what the guider got),
    both keyed (stage-1 step, pass): the first recorded under the guidance cache, the second above it."""
    pipe = ReferencePipeline(models)
    computed, returned = {}, {}
    inner = pipe.transformer_pass

    def computing(video, audio, perturbations):
        out = inner(video, audio, perturbations)
        if pipe.context.stage == "stage1":
            computed[(pipe.context.step, pipe.context.pass_name)] = out
        return out

    pipe.transformer_pass = computing
    with compose(pipe, setting):
        cached_run_pass = pipe.run_pass

        def received(name, video, audio, perturbations):
            out = cached_run_pass(name, video, audio, perturbations)
            if pipe.context.stage == "stage1":
                returned[(pipe.context.step, name)] = out
            return out

        pipe.run_pass = received
        out = pipe.run(request)
    return out, computed, returned


GUIDED = ("uncond", "stg", "modality")


def test_guidance_cache_hands_the_guider_cond_minus_the_last_difference(tiny_models):
    """Multistep, 6 steps, interval 2 from step 1: steps 2 and 4 run only the conditional pass, and each guidance
    pass the guider receives there is the step's conditional prediction minus (cond - pass) of the step before,
    exactly; the other steps are computed as without the cache; the counts say so."""
    from vidtune.techniques.caching.guidance_cache import reuse_mask

    assert reuse_mask(6, 1, 2, 1) == [False, False, True, False, True, False]
    # from step 0: step 1 already reuses step 0's differences
    r0 = GenerationRequest(prompt="passes", seed=2, mode="multistep", steps=4)
    out0, computed0, _ = _guided_passes_recorded(tiny_models, r0, {"caching.guidance_cache": {"interval": 2, "start": 0}})
    assert (1, "uncond") not in computed0 and out0.stats["caching.guidance_cache"]["stage1"]["cached"] == 3
    assert reuse_mask(6, 0, 1, 1) == [False] * 6 and reuse_mask(6, 0, 3, 0) == [False, True, True, False, True, True]
    r = GenerationRequest(prompt="passes", seed=2, mode="multistep", steps=6)
    out, computed, returned = _guided_passes_recorded(
        tiny_models, r, {"caching.guidance_cache": {"interval": 2, "start": 1, "passes": "all"}})
    for step in range(6):
        assert (step, "cond") in computed and torch.equal(returned[(step, "cond")][0], computed[(step, "cond")][0])
        for p in GUIDED:
            if step in (2, 4):
                assert (step, p) not in computed
                for i in (0, 1):  # video, audio
                    hand = computed[(step, "cond")][i] - (computed[(step - 1, "cond")][i] - computed[(step - 1, p)][i])
                    assert torch.equal(returned[(step, p)][i], hand)
            else:
                assert all(torch.equal(a, b) for a, b in zip(returned[(step, p)], computed[(step, p)]))
    assert out.stats["caching.guidance_cache"]["stage1"] == {"computed": 3 * 4, "cached": 3 * 2}
    base = ReferencePipeline(tiny_models).run(r)
    assert not torch.equal(out.frames, base.frames) and 10 < psnr_db(base.frames, out.frames).mean() < 100


def test_guidance_cache_drop_mode_and_pass_choice(tiny_models):
    """``drop`` hands the guider the conditional prediction itself (no guidance term on the step); ``passes``
    limits the skipping to the chosen pass; a distilled request has nothing to skip."""
    r = GenerationRequest(prompt="passes", seed=2, mode="multistep", steps=5)
    _, computed, returned = _guided_passes_recorded(
        tiny_models, r, {"caching.guidance_cache": {"interval": 2, "start": 2, "passes": "stg", "mode": "drop"}})
    assert (3, "stg") not in computed and (3, "uncond") in computed and (3, "modality") in computed
    assert all(torch.equal(a, b) for a, b in zip(returned[(3, "stg")], computed[(3, "cond")]))
    tech = get("caching.guidance_cache")
    distilled = GenerationRequest(prompt="passes", seed=2)
    assert not tech.applicable(distilled) and tech.applicable(r)
    assert not tech.effective(tech.validate({"interval": 2}), distilled)
    assert not tech.effective(tech.validate({"interval": 2, "start": 5}), r)  # (starts after the last step)
    assert not tech.effective(tech.validate({"interval": 2, "passes": "stg"}), replace(r, stg_scale=0.0))
    from vidtune.techniques.registry import KnobError

    with pytest.raises(KnobError, match="needs request.mode=multistep"):
        tech.check_request(tech.validate({"interval": 2}), distilled)
    with pytest.raises(CompositionError):
        with compose(ReferencePipeline(tiny_models), {"caching.guidance_cache": {"interval": 2},
                                                      "parallelism.guidance_parallel": {"degree": 2}}):
            pass


def test_guidance_cache_defers_a_refresh_that_step_skip_skips(tiny_models):
    """8 steps, step skip every 2 (steps 2, 4, 6 skipped), guidance cache interval 2 from step 2: every scheduled
    refresh (2, 4, 6) falls on a skipped step. ``refresh=scheduled`` (the behaviour before the knob) computes no
    guidance pass after step 1 but the last; ``computed`` reuses the passes on the skipped steps and refreshes on
    the next step that runs (3, 5), handing the guider the step's conditional prediction minus the difference
    of the last refresh, exactly."""
    from vidtune.techniques.caching.guidance_cache import deferred_mask, reuse_mask

    n = 8
    reuse, skipped = reuse_mask(n, 2, 2, 1), skip_mask(n, 2, 1, 1)
    assert skipped == [False, False, True, False, True, False, True, False]
    assert deferred_mask(reuse, skipped) == [False, False, True, False, True, False, True, False]
    assert deferred_mask(reuse, [False] * n) == reuse
    # a refresh deferred over two skipped steps, and a skipped step before any refresh is due
    assert deferred_mask([False, False, True, False, True, True, False],
                         [False, True, False, True, True, False, False]) == [False, True, False, True, True, False, False]
    r = GenerationRequest(prompt="passes", seed=2, mode="multistep", steps=n)
    skip = {"caching.step_skip": {"every": 2}}
    _, sched, _ = _guided_passes_recorded(tiny_models, r, {**skip, "caching.guidance_cache": {"interval": 2, "start": 2}})
    out, computed, returned = _guided_passes_recorded(
        tiny_models, r, {**skip, "caching.guidance_cache": {"interval": 2, "start": 2, "refresh": "computed"}})
    guided = lambda rec: sorted({step for step, p in rec if p == "uncond"})  # noqa: E731
    assert guided(sched) == [0, 1, 7]
    assert guided(computed) == [0, 1, 3, 5, 7]
    last_refresh = {2: 1, 3: None, 4: 3, 5: None, 6: 5}
    for step, ref in last_refresh.items():
        for p in GUIDED:
            if ref is None:
                assert all(torch.equal(a, b) for a, b in zip(returned[(step, p)], computed[(step, p)]))
                continue
            for i in (0, 1):
                hand = returned[(step, "cond")][i] - (computed[(ref, "cond")][i] - computed[(ref, p)][i])
                assert torch.equal(returned[(step, p)][i], hand)
    tech = get("caching.guidance_cache")
    from vidtune.techniques.registry import KnobError

    with pytest.raises(KnobError, match="refresh='computed'.*allowed with it: refresh='scheduled'"):
        tech.check_request(tech.validate({"interval": 2, "mode": "drop", "refresh": "computed"}), r)


def test_guidance_cache_frequency_split_scales_the_low_and_high_parts_apart(tiny_models):
    """split=fft: on a reused step of the stage's first half the guider gets cond - (low_gain x low + high) of the
    last computed difference, on the second half cond - (low + high_gain x high), low and high cut by a 2-D FFT
    over each latent frame (checked against numpy's complex FFT of the recorded difference); at gains of 1 it is the
    plain reuse up to float32 FFT rounding; the split needs mode=reuse."""
    import numpy as np

    from vidtune.techniques.caching.guidance_cache import split_frequencies
    from vidtune.techniques.registry import KnobError

    r = GenerationRequest(prompt="passes", seed=2, mode="multistep", steps=6)
    grids = {}
    split = {"interval": 2, "start": 1, "passes": "uncond", "split": "fft", "cutoff": 0.3, "low_gain": 1.4,
             "high_gain": 0.6}
    pipe = ReferencePipeline(tiny_models)
    original = pipe.transformer_pass

    def grid_seen(video, audio, perturbations):
        grids[pipe.context.stage] = pipe.context.grid
        return original(video, audio, perturbations)

    pipe.transformer_pass = grid_seen
    pipe.run(r)
    f, h, w = grids["stage1"]
    _, computed, returned = _guided_passes_recorded(tiny_models, r, {"caching.guidance_cache": split})

    def by_hand(delta, gain_low, gain_high):
        x = delta.double().numpy().reshape(delta.shape[0], f, h, w, delta.shape[-1])
        fy, fx = np.fft.fftfreq(h), np.fft.fftfreq(w)
        mask = (np.sqrt(fy[:, None] ** 2 + fx[None, :] ** 2) / 0.5 <= 0.3)[None, None, :, :, None]
        low = np.fft.ifft2(np.fft.fft2(x, axes=(2, 3)) * mask, axes=(2, 3)).real
        return torch.from_numpy((gain_low * low + gain_high * (x - low)).reshape(delta.shape))

    assert 0 < (np.sqrt(np.fft.fftfreq(h)[:, None] ** 2 + np.fft.fftfreq(w)[None, :] ** 2) / 0.5 <= 0.3).mean() < 1
    for step, gains in ((2, (1.4, 1.0)), (4, (1.0, 0.6))):  # (6 steps: 2 in the first half, 4 in the second)
        assert (step, "uncond") not in computed
        delta = computed[(step - 1, "cond")][0] - computed[(step - 1, "uncond")][0]
        cond = computed[(step, "cond")][0]
        hand = cond - by_hand(delta, *gains).to(cond.dtype)  # (in the passes' dtype, bf16, as the guider gets it)
        got = returned[(step, "uncond")][0]
        # float32 against float64 FFTs: a rare element rounds to the neighbouring bf16 value
        assert (got == hand).float().mean() > 0.99 and torch.allclose(got, hand, rtol=2 ** -7, atol=2 ** -10)
        plain = cond - delta
        assert (got.double() - plain.double()).abs().max() > 0.1 * delta.abs().max()  # (the gains did act)
        assert torch.equal(returned[(step, "uncond")][1], computed[(step, "cond")][1] -
                           (computed[(step - 1, "cond")][1] - computed[(step - 1, "uncond")][1]))  # audio: whole
    low, high = split_frequencies(delta, (f, h, w), 0.3)
    assert torch.allclose(low + high, delta.float(), atol=1e-6 * float(delta.abs().max()))
    assert split_frequencies(delta, (f, h, w + 1), 0.3) is None and split_frequencies(delta, None, 0.3) is None
    unit = {**split, "low_gain": 1.0, "high_gain": 1.0}
    _, _, at_one = _guided_passes_recorded(tiny_models, r, {"caching.guidance_cache": unit})
    _, _, plain = _guided_passes_recorded(tiny_models, r, {"caching.guidance_cache": {**split, "split": "none",
                                                                                      "cutoff": 0.25, "low_gain": 1.0,
                                                                                      "high_gain": 1.0}})
    for key in plain:
        assert torch.allclose(at_one[key][0], plain[key][0], atol=1e-4, rtol=1e-4)
    tech = get("caching.guidance_cache")
    with pytest.raises(KnobError, match="acts on the reused difference"):
        tech.check_request(tech.validate({"interval": 2, "mode": "drop", "split": "fft"}), r)
    with pytest.raises(KnobError, match="acts only with caching.guidance_cache.split='fft'"):
        tech.validate({"interval": 2, "low_gain": 1.2})


def test_the_caching_family_searches_the_guidance_cache_and_stg_prefix_for_multistep_requests_only():
    """The campaign's caching study offers the guidance cache's knobs for a multistep request (starts within
    its steps; the deferred refresh with reuse), and the STG prefix, alone or with a residual cache; neither for a distilled one."""
    import optuna

    from vidtune.search.campaign import sample_family_setting

    def sampled(request):
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
        params, settings = set(), []
        for _ in range(40):
            trial = study.ask()
            settings.append(sample_family_setting(trial, "caching", request))
            params |= set(trial.params)
            study.tell(trial, 1.0)
        return params, settings

    multistep = GenerationRequest(prompt="passes", seed=2, mode="multistep", steps=12)
    params, settings = sampled(multistep)
    assert {"caching.guidance_cache.use", "caching.guidance_cache.interval", "caching.guidance_cache.start"} <= params
    chosen = [s["caching.guidance_cache"] for s in settings if "caching.guidance_cache" in s]
    assert chosen and all(1 <= c["start"] <= 10 and c["interval"] >= 2 for c in chosen)
    # the deferred refresh is sampled with reuse only (check_request rejects it with drop), and beside step skip
    assert {c.get("refresh") for c in chosen if c["mode"] == "reuse"} == {"scheduled", "computed"}
    assert all("refresh" not in c for c in chosen if c["mode"] == "drop")
    assert any(s.get("caching.guidance_cache", {}).get("refresh") == "computed" and "caching.step_skip" in s
               for s in settings)
    assert any(s.get("caching.stg_prefix") == {"enabled": True} for s in settings)
    # the prefix runs inside either residual cache (a composition rule), which never run together
    assert any("caching.stg_prefix" in s and ("caching.first_block" in s or "caching.teacache" in s) for s in settings)
    assert not any("caching.first_block" in s and "caching.teacache" in s for s in settings)
    params, _ = sampled(GenerationRequest(prompt="passes", seed=2))
    assert not any(p.startswith(("caching.guidance_cache", "caching.stg_prefix")) for p in params)


def _block_calls(pipe):
    """(stage, pass name, block index, batch rows) of every transformer block call while ``pipe`` runs."""
    calls = []
    for i, block in enumerate(pipe.models.transformer.velocity_model.transformer_blocks):
        block.register_forward_pre_hook(
            lambda mod, args, kwargs, i=i: calls.append((pipe.context.stage, pipe.context.pass_name, i,
                                                         kwargs["video"].x.shape[0])) if pipe.context else None,
            with_kwargs=True)
    return calls


def test_stg_prefix_is_bit_identical_and_runs_the_stg_pass_from_its_first_perturbed_block():
    """tiny (2 blocks, STG skips block 1's self-attention), multistep, 4 steps: each step's STG pass runs only
    block 1, on the tokens the conditional pass had there, and the whole output (frames, audio, both stages'
    latents) is bit-identical to the reference; the record counts the 4 resumed passes."""
    from vidtune.model import ModelSource, load_models

    r = GenerationRequest(prompt="passes", seed=2, mode="multistep", steps=4)
    base = ReferencePipeline(load_models(ModelSource(preset="tiny"))).run(r)
    pipe = ReferencePipeline(load_models(ModelSource(preset="tiny")))
    calls = _block_calls(pipe)
    with compose(pipe, {"caching.stg_prefix": {"enabled": True}}):
        out = pipe.run(r)
    for a, b in ((out.frames, base.frames), (out.audio, base.audio), (out.stage1.video, base.stage1.video),
                 (out.stage2.video, base.stage2.video), (out.stage1.audio, base.stage1.audio)):
        assert torch.equal(a, b)
    stg = [c[2] for c in calls if c[:2] == ("stage1", "stg")]
    assert stg == [1] * 4  # (block 0 never ran for the STG pass)
    assert len([c for c in calls if c[:2] == ("stage1", "cond")]) == 8  # the conditional pass runs whole
    assert out.stats["caching.stg_prefix"] == {"stage1": {"resumed": 4, "whole": 0, "blocks_skipped": 4}}
    assert out.stats["stage1.passes"] == 16  # (a pass is still a pass: only its first blocks are left out)
    tech = get("caching.stg_prefix")
    distilled = GenerationRequest(prompt="passes", seed=2)
    assert not tech.applicable(distilled) and tech.applicable(r) and not tech.applicable(replace(r, stg_scale=0.0))
    from vidtune.techniques.registry import KnobError

    with pytest.raises(KnobError, match="needs request.mode=multistep"):
        tech.check_request(tech.validate({"enabled": True}), distilled)
    with pytest.raises(KnobError, match="stg_scale"):
        tech.check_request(tech.validate({"enabled": True}), replace(r, stg_scale=0.0))
    assert tech.neutral(r, "cpu") == {"enabled": True}


def test_stg_prefix_never_resumes_from_another_steps_tokens(tiny_models):
    """Tokens saved at one step are not taken by another step's STG pass: step 1's STG pass is reused by the
    guidance cache at step 2 (its conditional tokens stay saved), and step 3's conditional pass is made to save
    nothing; step 3's STG pass then runs whole and the output is that of the guidance cache alone, bit for bit."""
    r = GenerationRequest(prompt="passes", seed=2, mode="multistep", steps=4)
    gc = {"caching.guidance_cache": {"interval": 2, "start": 1, "passes": "stg", "last_kept": 1}}
    alone = ReferencePipeline(tiny_models)
    with compose(alone, gc):
        want = alone.run(r)
    pipe = ReferencePipeline(tiny_models)
    inner = pipe.transformer_pass

    def hide_step3_cond(video, audio, perturbations):
        ctx = pipe.context
        if ctx.stage == "stage1" and ctx.step == 3 and ctx.pass_name == "cond":
            pipe.context = replace(ctx, pass_name="cond-unsaved")
            try:
                return inner(video, audio, perturbations)
            finally:
                pipe.context = ctx
        return inner(video, audio, perturbations)

    pipe.transformer_pass = hide_step3_cond
    with compose(pipe, {**gc, "caching.stg_prefix": {"enabled": True}}):
        out = pipe.run(r)
    assert out.stats["caching.guidance_cache"]["stage1"]["cached"] == 1  # (step 2's STG pass)
    assert out.stats["caching.stg_prefix"]["stage1"] == {"resumed": 2, "whole": 1, "blocks_skipped": 2}
    assert torch.equal(out.frames, want.frames) and torch.equal(out.stage1.video, want.stage1.video)


def test_stg_prefix_in_a_batched_step_runs_the_first_blocks_without_the_stg_row():
    """With batched guidance passes: block 0 runs on three rows (cond, uncond, modality), block 1 on four, the
    STG row starting from the conditional row's tokens; the video matches the reference within the batched
    passes' own tolerance, and the guidance cache composes (its reused steps batch no STG row)."""
    from vidtune.model import ModelSource, load_models

    r = GenerationRequest(prompt="passes", seed=2, mode="multistep", steps=4)
    models = load_models(ModelSource(preset="tiny"))
    base = ReferencePipeline(models).run(r)
    pipe = ReferencePipeline(load_models(ModelSource(preset="tiny")))
    calls = _block_calls(pipe)
    with compose(pipe, {"caching.stg_prefix": {"enabled": True}, "kernel_choice.batched_guidance": {"enabled": True}}):
        out = pipe.run(r)
    batch = [c for c in calls if c[0] == "stage1"]
    assert {c[1] for c in batch} == {"batch:cond+uncond+stg+modality"}
    assert [(c[2], c[3]) for c in batch] == [(0, 3), (1, 4)] * 4
    assert out.stats["caching.stg_prefix"]["stage1"] == {"resumed": 4, "whole": 0, "blocks_skipped": 4}
    assert psnr_db(base.frames, out.frames).mean() >= 60 and psnr_db(base.frames, out.frames).min() >= 50
    pipe2 = ReferencePipeline(models)
    with compose(pipe2, {"caching.stg_prefix": {"enabled": True}, "kernel_choice.batched_guidance": {"enabled": True},
                         "caching.guidance_cache": {"interval": 2, "start": 1}}):
        both = pipe2.run(r)
    assert both.stats["caching.stg_prefix"]["stage1"]["resumed"] == 3  # (step 2 runs the conditional pass alone)
    assert psnr_db(base.frames, both.frames).mean() > 10


# (tiny's residuals and modulated inputs move a lot between steps: only thresholds near 1 reuse any)
_ROW_CACHES = [("caching.first_block", {"threshold": 1.0, "max_consecutive": 2}),
               ("caching.teacache", {"threshold": 1.0})]


@pytest.mark.parametrize("name,values", _ROW_CACHES, ids=["first_block", "teacache"])
def test_a_residual_cache_in_a_batched_step_decides_each_pass_as_it_would_alone(tiny_models, name, values):
    """With batched guidance passes the residual caches keep a state per row under the row's pass name: they
    cache the same passes as without the batch, the blocks after the probe run on the rows they compute only,
    and the video is the unbatched cache's within the batched passes' tolerance."""
    r = GenerationRequest(prompt="passes", seed=2, mode="multistep", steps=8)
    pipe = ReferencePipeline(tiny_models)
    with compose(pipe, {name: values}):
        alone = pipe.run(r)
    pipe = ReferencePipeline(tiny_models)
    calls = _block_calls(pipe)
    with compose(pipe, {name: values, "kernel_choice.batched_guidance": {"enabled": True}}):
        batched = pipe.run(r)
    counts = alone.stats[name]["stage1"]
    assert counts["cached"] > 0 and counts["computed"] > 0
    assert batched.stats[name] == alone.stats[name]
    rest = [c[3] for c in calls if c[0] == "stage1" and c[2] == 1]  # the rows block 1 (after any probe) ran on
    assert sum(rest) == counts["computed"]
    assert psnr_db(alone.frames, batched.frames).mean() >= 60 and psnr_db(alone.frames, batched.frames).min() >= 50


@pytest.mark.parametrize("name,values", _ROW_CACHES, ids=["first_block", "teacache"])
def test_a_residual_cache_in_a_batched_step_with_rows_decided_apart(tiny_models, monkeypatch, name, values):
    """Rows of one batch decided differently (forced: the statistic alternates between never and always
    reusing, in the order the passes would be decided alone): the blocks run on the computed rows only, each
    reused row takes its own residual, and the video is the unbatched run's with the same decisions, within
    the batch's tolerance."""
    import importlib
    import itertools

    module = importlib.import_module(f"vidtune.techniques.{name}")

    def alternating():
        flip = itertools.cycle([float("inf"), 0.0])
        monkeypatch.setattr(module, "relative_l1", lambda pipeline, now, prev: next(flip))

    r = GenerationRequest(prompt="passes", seed=2, mode="multistep", steps=6)
    values = {**values, "threshold": 0.5}
    alternating()
    pipe = ReferencePipeline(tiny_models)
    with compose(pipe, {name: values}):
        alone = pipe.run(r)
    alternating()
    pipe = ReferencePipeline(tiny_models)
    calls = _block_calls(pipe)
    with compose(pipe, {name: values, "kernel_choice.batched_guidance": {"enabled": True}}):
        batched = pipe.run(r)
    assert batched.stats[name] == alone.stats[name]
    rest = [c[3] for c in calls if c[0] == "stage1" and c[2] == 1]
    assert sum(rest) == alone.stats[name]["stage1"]["computed"] and {1, 2, 3} & set(rest)
    assert psnr_db(alone.frames, batched.frames).mean() >= 60 and psnr_db(alone.frames, batched.frames).min() >= 50


@pytest.fixture(scope="module")
def deeper_tiny():
    """tiny with 4 blocks and STG at block 2: a first-block probe (block 0) leaves a block to share."""
    import dataclasses

    from vidtune.model import ModelSource, load_models, presets

    tiny = presets.PRESETS["tiny"]
    config = tiny.copy_config()
    config["transformer"]["num_layers"] = 4
    presets.PRESETS["tiny_stg2"] = dataclasses.replace(tiny, name="tiny_stg2", config=config, stg_blocks=(2,))
    try:
        yield load_models(ModelSource(preset="tiny_stg2"))
    finally:
        del presets.PRESETS["tiny_stg2"]


@pytest.mark.parametrize("name,values", _ROW_CACHES, ids=["first_block", "teacache"])
def test_stg_prefix_inside_a_residual_cache_changes_nothing_the_cache_decides(deeper_tiny, monkeypatch, name,
                                                                              values):
    """With a residual cache the STG prefix runs in the cache's block loop: the cache decides every pass as it
    does alone (its statistic forced to alternate, as above, so that it reuses some passes), and an STG pass it
    computes resumes at block 2 from the conditional pass's tokens when that pass was computed in the same
    step; the video is the cache's alone, bit for bit (batched: within the batch's tolerance)."""
    import importlib
    import itertools

    module = importlib.import_module(f"vidtune.techniques.{name}")

    def alternating():
        flip = itertools.cycle([float("inf"), 0.0, float("inf")])
        monkeypatch.setattr(module, "relative_l1", lambda pipeline, now, prev: next(flip))

    r = GenerationRequest(prompt="passes", seed=2, mode="multistep", steps=8)
    pfx = {"caching.stg_prefix": {"enabled": True}}
    values = {**values, "threshold": 0.5}
    probe = 1 if name == "caching.first_block" else 0  # (blocks the cache runs before it decides)
    for extra in ({}, {"kernel_choice.batched_guidance": {"enabled": True}}):
        alternating()
        pipe = ReferencePipeline(deeper_tiny)
        with compose(pipe, {name: values, **extra}):
            alone = pipe.run(r)
        alternating()
        pipe = ReferencePipeline(deeper_tiny)
        calls = _block_calls(pipe)
        with compose(pipe, {name: values, **pfx, **extra}):
            both = pipe.run(r)
        assert both.stats[name] == alone.stats[name]
        assert alone.stats[name]["stage1"]["cached"] > 0
        shared = both.stats["caching.stg_prefix"]["stage1"]
        assert shared["resumed"] > 0 and shared["blocks_skipped"] == shared["resumed"] * (2 - probe)
        if not extra:
            assert torch.equal(both.frames, alone.frames)
            stg = [c[2] for c in calls if c[:2] == ("stage1", "stg")]
            # block 1 runs for the STG passes computed without the conditional tokens only
            assert stg.count(1) == shared["whole"] and stg.count(2) == shared["whole"] + shared["resumed"]
        else:
            assert psnr_db(alone.frames, both.frames).mean() >= 60 and psnr_db(alone.frames, both.frames).min() >= 50
            # a step whose rows are all computed: block 1 without the STG row, block 2 with it
            rows = [(c[2], c[3]) for c in calls if c[0] == "stage1" and c[2] in (1, 2)]
            assert (1, 3) in rows and (2, 4) in rows
