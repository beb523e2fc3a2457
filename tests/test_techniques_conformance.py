"""The conformance suite: every registered technique passes these checks automatically (docs/architecture.md: adding a technique).

A new technique gets: off == reference bit for bit; its active-but-neutral setting (patch installed)
== reference bit for bit; every knob's domain samples and validates; apply then undo restores the
pipeline (state and output); bad values raise a clear KnobError; what it patches lies in the seams it
declares; overlapping seams have a composition rule. The parallelism family runs the same checks in a
2-process gloo world. The last tests show each check failing on a deliberately broken technique.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from conformance import (
    check_apply_undo,
    check_bad_values,
    check_neutral,
    check_off,
    check_seams,
    parallel_conformance,
    valid_samples,
)
from vidtune.model import ReferencePipeline
from vidtune.techniques import FAMILIES, CompositionError, Knob, Patch, Technique, get, register, registered
from vidtune.techniques.registry import unregister
from vidtune.techniques.setting import check_composition, composition_rule, overlapping_seams
from vidtune.techniques.seams import SEAMS

TECHNIQUES = registered()
IDS = [t.name for t in TECHNIQUES]
ONE_PROCESS = [t for t in TECHNIQUES if t.family != "parallelism"]
PARALLEL = [t for t in TECHNIQUES if t.family == "parallelism"]


_CASES: dict[str, Any] = {}

# The request most checks run at: 192x256x9 (0.38 s a generation of tiny on one core of a 2-core EPYC against
# 0.87 s at the shared 256x384x17, most of it the VAE decoder's convolutions). Every sample of every technique
# applies there as at 256x384x17 (stage-2 tiles included: 3 of their 4, as there; at 128x192 only 1 would).
SMALL = {"height": 192, "width": 256, "frames": 9}


def _compiles(technique: Technique) -> bool:
    return any(technique.compiles(technique.validate(v)) for v in valid_samples(technique, 1, 30)[:3])


def _case(key: str, models, request) -> tuple[Any, Any]:
    if key not in _CASES:
        _CASES[key] = (request, ReferencePipeline(models).run(request))
    return _CASES[key]


def _for(technique, tiny_models, tiny_request, tiny_reference_output):
    """(request, reference output) to check ``technique`` on: a small distilled request, or for a technique that
    compiles the suite's shared 256x384x17 one (its graphs are then compiled once for the suite: the compile
    tests run at that size, and Inductor's cache serves the one that comes second); for a technique that acts
    on guided steps only (``applicable``: the guidance cache) a 3-step multistep one of the same size."""
    compiled = technique.family != "parallelism" and _compiles(technique)
    if technique.family == "parallelism" or compiled:
        request, reference = tiny_request, tiny_reference_output
    else:
        request, reference = _case("small", tiny_models, type(tiny_request).from_dict({**tiny_request.to_dict(),
                                                                                         **SMALL}))
    if technique.family == "parallelism" or technique.applicable(request):
        return request, reference
    guided = type(request).from_dict({**request.to_dict(), "mode": "multistep", "steps": 3})
    return _case(f"guided-{compiled}", tiny_models, guided)


def test_families_declared():
    assert FAMILIES == ("caching", "sparse_attention", "tiling", "kernel_choice", "parallelism", "memory")
    assert TECHNIQUES, "at least one technique is registered"
    for t in TECHNIQUES:
        assert t.family in FAMILIES and t.name.startswith(t.family + ".")
        assert t.knobs and t.stages and t.seams


@pytest.mark.parametrize("technique", TECHNIQUES, ids=IDS)
def test_off_is_bit_identical(technique, tiny_models, tiny_request, tiny_reference_output):
    check_off(technique, tiny_models, *_for(technique, tiny_models, tiny_request, tiny_reference_output))


@pytest.mark.parametrize("technique", ONE_PROCESS, ids=[t.name for t in ONE_PROCESS])
def test_neutral_setting_is_bit_identical(technique, tiny_models, tiny_request, tiny_reference_output):
    """Where a technique has an exact setting, the patch is installed and the output does not move."""
    if not check_neutral(technique, tiny_models, *_for(technique, tiny_models, tiny_request, tiny_reference_output)):
        assert technique.inexact
        pytest.skip(f"{technique.name} has no exact active setting: {technique.inexact}")


def test_most_techniques_have_a_neutral_setting(tiny_request):
    """The exemptions are the ones that change arithmetic by design, named here so a new one is noticed."""
    exempt = {t.name for t in ONE_PROCESS if t.neutral(tiny_request, torch.device("cpu")) is None}
    assert exempt == {"kernel_choice.compile", "kernel_choice.fp8_linear", "kernel_choice.batched_guidance",
                      "memory.fp8_weights"}


@pytest.mark.parametrize("technique", TECHNIQUES, ids=IDS)
def test_domains_sample_and_validate(technique):
    assert len(valid_samples(technique, 0, 30)) >= 5
    for k in technique.knobs:
        assert k.validate(k.off) == k.off


# Each sample of a compiling technique is a compile from scratch (minutes of Dynamo and Inductor on a 2-core
# CPU without AVX512: 270 s for compile's three, 122 s for vae_decode's); one sample checks its undo.
SAMPLES = {"kernel_choice.compile": 1, "kernel_choice.vae_decode": 1}


@pytest.mark.parametrize("technique", ONE_PROCESS, ids=[t.name for t in ONE_PROCESS])
def test_apply_then_undo_restores(technique, tiny_models, tiny_request, tiny_reference_output):
    request, reference = _for(technique, tiny_models, tiny_request, tiny_reference_output)
    samples = valid_samples(technique, 1, 30)[:SAMPLES.get(technique.name, 3)]
    neutral = technique.neutral(request, torch.device("cpu"))
    applied = check_apply_undo(technique, tiny_models, request, reference, samples + ([neutral] if neutral else []))
    assert applied >= 1, f"{technique.name}: no sample could be applied, so nothing was undone"


@pytest.mark.parametrize("technique", TECHNIQUES, ids=IDS)
def test_bad_values_raise_clear_errors(technique):
    check_bad_values(technique)


@pytest.mark.parametrize("technique", ONE_PROCESS, ids=[t.name for t in ONE_PROCESS])
def test_patches_stay_in_declared_seams(technique, tiny_models, tiny_request, tiny_reference_output):
    request, _ = _for(technique, tiny_models, tiny_request, tiny_reference_output)
    settings = valid_samples(technique, 2, 20)[:3]
    neutral = technique.neutral(request, torch.device("cpu"))
    assert check_seams(technique, tiny_models, request, settings + ([neutral] if neutral else [])) >= 1


def test_parallelism_conforms_in_a_gloo_world():
    """Neutral setting == one process bit for bit, apply/undo and seams, in 2 real gloo processes."""
    from vidtune.techniques.parallelism.distributed import launch

    names = [t.name for t in PARALLEL]
    ranks = launch(parallel_conformance, 2, names)
    for rank in ranks:
        for name in names:
            res = rank[name]
            assert res["ok"], (name, res)
            assert res["neutral"] and res["applied"] == 1 and res["seams_applied"] == 1, (name, res)


def _active(technique: Technique) -> dict:
    """Some valid setting that is not off (for composition checks, which touch no pipeline)."""
    for values in valid_samples(technique, 3, 30):
        if not technique.is_off(values):
            return values
    raise AssertionError(f"{technique.name}: no active sample")


def test_composition_is_checked_for_every_overlapping_pair():
    """A pair of techniques whose seams overlap (equal or nested) composes only by a declared rule."""
    checked = 0
    for i, a in enumerate(TECHNIQUES):
        for b in TECHNIQUES[i + 1:]:
            values = {a.name: _active(a), b.name: _active(b)}
            if overlapping_seams(a, b) and composition_rule(a, b) is None:
                with pytest.raises(CompositionError, match=f"{a.name} and {b.name} both claim"):
                    check_composition(values)
                checked += 1
            else:
                check_composition(values)
    assert checked >= 5
    # the nested case the flat strings missed: Sol (attention.video_self.sparse) meets the SDPA backend
    # (attention.video_self) and composes by its declared rule
    assert overlapping_seams(get("sparse_attention.sol"), get("kernel_choice.sdpa_backend"))
    assert composition_rule(get("sparse_attention.sol"), get("kernel_choice.sdpa_backend"))


def test_composition_rules_name_real_overlaps():
    """Every declared rule names a registered technique whose seams overlap (a stale rule is noticed)."""
    names = {t.name for t in TECHNIQUES}
    for t in TECHNIQUES:
        for other, rule in t.composes_with.items():
            assert other in names and rule, (t.name, other)
            assert overlapping_seams(t, get(other)), f"{t.name} declares a rule with {other}, but no seam overlaps"


def test_undeclared_seam_is_refused_at_registration():
    with pytest.raises(ValueError, match="undeclared seam"):
        @register("caching.bad_seam")
        class Bad(Technique):
            knobs = (Knob("on", "bool", off=False),)
            stages = ("stage1",)
            seams = ("transformer.not_a_place",)

            def apply_active(self, pipeline, values):
                return Patch(self.name)
    unregister("caching.bad_seam")
    assert "attention.video_self.sparse" in SEAMS and SEAMS["attention.video_self.sparse"].parent == "attention.video_self"


# ----------------------------------------------------------------------------- broken techniques
# Each is registered for one test and shows one conformance check failing.

def _scaled_decode(pipeline: Any, patch: Patch, scale: float) -> None:
    original = pipeline.decode_video

    def decode(latent, rng_state):
        return original(latent * scale, rng_state)

    patch.set_attr(pipeline, "decode_video", decode)


@pytest.fixture()
def broken():
    made: list[str] = []

    def make(name: str, **attrs: Any) -> Technique:
        cls = type(name.split(".")[1], (Technique,), {
            "knobs": (Knob("scale", "float", off=1.0, low=0.5, high=2.0),),
            "stages": ("decode_video",), "seams": ("decode.video",), **attrs})
        register(name)(cls)
        made.append(name)
        return get(name)

    yield make
    for name in made:
        unregister(name)


def _apply_scaled(self, pipeline, values):
    patch = Patch(self.name)
    _scaled_decode(pipeline, patch, values["scale"])
    return patch


def test_off_check_fails_on_a_technique_active_when_off(broken, tiny_models, tiny_request, tiny_reference_output):
    tech = broken("tiling.broken_off", apply_active=_apply_scaled,
                  apply=lambda self, pipeline, values: self.apply_active(pipeline, {"scale": 1.5}))
    with pytest.raises(AssertionError, match="off is not bit-identical"):
        check_off(tech, tiny_models, tiny_request, tiny_reference_output)


def test_neutral_check_fails_on_a_neutral_setting_that_moves_the_output(broken, tiny_models, tiny_request,
                                                                        tiny_reference_output):
    tech = broken("tiling.broken_neutral", apply_active=_apply_scaled,
                  neutral=lambda self, request, device: {"scale": 1.01})
    with pytest.raises(AssertionError, match="changed the output"):
        check_neutral(tech, tiny_models, tiny_request, tiny_reference_output)
    silent = broken("tiling.broken_silent", apply_active=_apply_scaled, neutral=lambda self, request, device: None)
    with pytest.raises(AssertionError, match="no reason"):
        check_neutral(silent, tiny_models, tiny_request, tiny_reference_output)


def test_undo_check_fails_on_a_patch_that_is_not_undone(broken, tiny_models, tiny_request, tiny_reference_output):
    def leaky(self, pipeline, values):
        pipeline.leftover = values["scale"]  # set behind the patch's back
        return Patch(self.name)

    tech = broken("tiling.broken_undo", apply_active=leaky)
    with pytest.raises(AssertionError, match="left the pipeline changed"):
        check_apply_undo(tech, tiny_models, tiny_request, tiny_reference_output, [{"scale": 1.5}])


def test_bad_values_check_fails_on_a_technique_that_accepts_anything(broken):
    tech = broken("tiling.broken_values", apply_active=_apply_scaled,
                  validate=lambda self, values: {"scale": 1.0})
    with pytest.raises(AssertionError, match="was accepted"):
        check_bad_values(tech)


def test_seam_check_fails_on_a_patch_outside_its_seams(broken, tiny_models, tiny_request):
    tech = broken("tiling.broken_seams", apply_active=_apply_scaled, seams=("vae.tiles",))
    with pytest.raises(AssertionError, match="patched 'decode.video'"):
        check_seams(tech, tiny_models, tiny_request, [{"scale": 1.5}])
    # and the same technique passes when it declares what it patches
    ok = broken("tiling.fixed_seams", apply_active=_apply_scaled)
    assert check_seams(ok, tiny_models, tiny_request, [{"scale": 1.5}]) == 1


def test_seam_check_sees_every_transformer(tiny_models, tiny_request):
    """With a stage-2 transformer of its own (the distilled-LoRA path), patches reach both transformers."""
    import copy

    from vidtune.model.loading import Models

    models = Models(**{**vars(tiny_models), "stage2_transformer": copy.deepcopy(tiny_models.transformer)})
    pipe = ReferencePipeline(models)
    assert len(pipe.transformers()) == 2
    with get("kernel_choice.fused_norms").apply(pipe, {"ops": "norms", "backend": "reference"}) as patch:
        assert {id(b) for b, _ in patch.touched} == {id(b) for b in pipe.transformer_blocks()}
    with get("sparse_attention.sol").apply(pipe, {"beta": 1.0, "dense_layers": 1}) as patch:
        # dense_layers counts blocks within each transformer
        assert len(patch.touched) == 2 * (len(tiny_models.transformer.velocity_model.transformer_blocks) - 1)

