"""Knob and registry mechanics, with throw-away techniques registered only for these tests."""

from __future__ import annotations

import pytest
import torch

from vidtune.model import ReferencePipeline
from vidtune.techniques import CompositionError, Knob, KnobError, Patch, Technique, compose, get, register
from vidtune.techniques.registry import unregister
from vidtune.techniques.setting import parse_knob_assignments, stages_touched


@pytest.fixture()
def toy_techniques():
    @register("caching.toy_a")
    class ToyA(Technique):
        knobs = (Knob("scale", "float", off=1.0, low=0.5, high=2.0),)
        stages = ("decode_video",)
        seams = ("decode.video",)

        def apply_active(self, pipeline, values):
            patch = Patch(self.name)
            original = pipeline.decode_video

            def scaled(latent, rng_state):
                return original(latent * values["scale"], rng_state)

            patch.set_attr(pipeline, "decode_video", scaled)
            return patch

    @register("tiling.toy_b")
    class ToyB(Technique):
        knobs = (Knob("on", "bool", off=False),)
        stages = ("decode_video",)
        seams = ("decode.video",)

        def apply_active(self, pipeline, values):
            return Patch(self.name)

    yield get("caching.toy_a"), get("tiling.toy_b")
    unregister("caching.toy_a")
    unregister("tiling.toy_b")


def test_knob_kinds_validate():
    k = Knob("n", "int", off=0, low=0, high=4)
    assert k.validate("3") == 3
    with pytest.raises(KnobError, match=r"n must be an int in \[0, 4\], got 5"):
        k.validate(5)
    f = Knob("t", "float", off=0.1, low=0.01, high=1.0, log=True)
    assert f.validate("0.5") == 0.5
    with pytest.raises(KnobError, match="log scale"):
        Knob("bad", "float", off=0.0, low=0.0, high=1.0, log=True)
    b = Knob("b", "bool", off=False)
    assert b.validate("true") is True and b.validate(False) is False
    c = Knob("c", "categorical", off="off", choices=("off", "x"))
    with pytest.raises(KnobError, match=r"c must be one of \['off', 'x'\], got 'y'"):
        c.validate("y")
    with pytest.raises(KnobError, match="kind must be one of"):
        Knob("z", "complex", off=0)


def test_compose_rejects_conflicting_seams(toy_techniques, tiny_models):
    pipe = ReferencePipeline(tiny_models)
    before = pipe.decode_video
    with pytest.raises(CompositionError, match="caching.toy_a and tiling.toy_b both claim seam 'decode.video'"):
        compose(pipe, {"caching.toy_a": {"scale": 1.5}, "tiling.toy_b": {"on": True}})
    assert pipe.decode_video == before  # nothing was applied
    # an off technique claims nothing
    with compose(pipe, {"caching.toy_a": {"scale": 1.5}, "tiling.toy_b": {"on": False}}):
        assert pipe.decode_video != before
    assert "decode_video" not in vars(pipe)


def test_stages_touched_and_parse(toy_techniques):
    assert stages_touched({"caching.toy_a": {"scale": 1.0}}) == []
    assert stages_touched({"caching.toy_a": {"scale": 2.0}}) == ["decode_video"]
    assert parse_knob_assignments(["caching.toy_a.scale=1.5"]) == {"caching.toy_a": {"scale": "1.5"}}
    with pytest.raises(KnobError, match="unknown technique 'caching.nope'"):
        parse_knob_assignments(["caching.nope.x=1"])
    with pytest.raises(KnobError, match="must look like"):
        parse_knob_assignments(["caching.toy_a.scale"])


def test_register_rejects_bad_names():
    with pytest.raises(ValueError, match="family in"):
        register("speed.thing")


def test_sdpa_backend_patches_only_its_kind(tiny_models):
    pipe = ReferencePipeline(tiny_models)
    tech = get("kernel_choice.sdpa_backend")
    video = pipe.attention_modules("video_self")
    audio = pipe.attention_modules("audio_self")
    before_audio = [m.attention_function for m in audio]
    with tech.apply(pipe, {"video_self": "math"}):
        assert all(type(m.attention_function).__name__ == "SDPAAttention" for m in video)
        assert [m.attention_function for m in audio] == before_audio
    assert all(type(m.attention_function).__name__ != "SDPAAttention" for m in video)


def test_sdpa_backends_are_exact_attention():
    """Every backend choice computes the same attention as the fp32 reference (bf16 tolerance)."""
    from vidtune.kernels.sdpa import SDPA_BACKENDS, SDPAAttention, sdpa_reference

    g = torch.Generator().manual_seed(0)
    for tq, tk in [(64, 64), (7, 300)]:
        q, k, v = (torch.randn(1, n, 4 * 16, generator=g).bfloat16() for n in (tq, tk, tk))
        ref = sdpa_reference(q, k, v, 4).float()
        for name in SDPA_BACKENDS:
            out = SDPAAttention(name)(q, k, v, 4).float()
            # bf16 output rounding: relative 2^-8 of values of order 1
            assert torch.allclose(out, ref, atol=2e-2, rtol=1e-2), name


def test_a_setting_transfers_to_another_model_by_depth_and_size():
    """transfer_setting (quality measured on a trained model at "the same" setting): block counts follow the
    depth, latent tile overlaps and window sizes the frame's long side, on the knob's grid and in its domain; a
    count above zero stays at least one, an off value of zero or below stays off, a positive one is a quantity;
    VAE tiles stay in pixels and frames (a seam's cost follows the decoder's receptive field, not the frame)."""
    from vidtune.techniques.transfer import transfer_setting

    values = {"sparse_attention.sol": {"beta": 1.25, "dense_layers": 12, "stages": "both", "stage1_dense_layers": 1},
              "caching.first_block": {"threshold": 0.2, "fn_blocks": 4},
              "tiling.vae_tiles": {"spatial_px": 768, "spatial_overlap_px": 128, "temporal_frames": 24,
                                   "temporal_overlap_frames": 8},
              "tiling.stage2_tiles": {"rows": 2, "cols": 2, "overlap": -1}}
    big, small = {"depth": 48, "size": 1536, "frames": 121}, {"depth": 3, "size": 384, "frames": 17}
    mapped, notes = transfer_setting(values, big, small)
    sol = mapped["sparse_attention.sol"]
    assert sol["beta"] == 1.25 and sol["dense_layers"] == 1 and sol["stage1_dense_layers"] == 1 and sol["stages"] == "both"
    assert mapped["caching.first_block"]["fn_blocks"] == 1 and mapped["caching.first_block"]["threshold"] == 0.2
    assert mapped["tiling.vae_tiles"] == {"spatial_px": 768, "spatial_overlap_px": 128, "temporal_frames": 24,
                                          "temporal_overlap_frames": 8}
    assert mapped["tiling.stage2_tiles"] == {"rows": 2, "cols": 2, "overlap": -1}  # counts of tiles; overlap off
    assert "sparse_attention.sol.dense_layers: 12 -> 1 (depth 48 -> 3)" in notes and len(notes) == 2
    # the other way: 2 of 3 blocks -> 32 of 48, a 4-pixel stage-2 overlap at 384 -> 16 at 1536
    up, _ = transfer_setting({"sparse_attention.sol": {"beta": 1.25, "dense_layers": 2},
                              "tiling.stage2_tiles": {"rows": 2, "cols": 2, "overlap": 4}}, small, big)
    assert up["sparse_attention.sol"]["dense_layers"] == 32 and up["tiling.stage2_tiles"]["overlap"] == 16
    from vidtune.techniques.setting import resolve_values

    same, none = transfer_setting(values, big, big)
    assert same == resolve_values(values) and none == []
    # a positive off value is a quantity: the first-block cache's default of 1 probe block of 3 is 16 of 48, kept
    # in the knob's domain (at most 4)
    fb, _ = transfer_setting({"caching.first_block": {"threshold": 0.2}}, small, big)
    assert fb["caching.first_block"]["fn_blocks"] == 4


def test_a_setting_is_validated_once_immutable_and_crosses_processes_as_it_is(toy_techniques, tiny_request):
    """``Setting`` validates when built (full values, name order; a bad value names its knob), cannot be changed,
    equals and writes like the plain dict, and every function below the entry point takes it without validating
    again: the checks, the stages, the compile signature and ``compose`` each leave the knob validation count
    unchanged (before the type, a trial validated its setting four or more times). Pickled (Ray) it comes back
    without being validated, even where its technique is not registered."""
    import json
    import pickle

    from vidtune.techniques.setting import (Setting, check_composition, check_request, compile_signature)

    calls = [0]
    toy_a, _ = toy_techniques
    original = type(toy_a).check

    def counting(self, values):
        calls[0] += 1
        return original(self, values)

    type(toy_a).check = counting
    try:
        s = Setting({"tiling.toy_b": {"on": "true"}, "caching.toy_a": {"scale": "1.5"}})
        assert calls == [1] and list(s) == ["caching.toy_a", "tiling.toy_b"]
        assert s == {"caching.toy_a": {"scale": 1.5}, "tiling.toy_b": {"on": True}}
        assert json.loads(json.dumps(s)) == s and Setting.of(s) is s and hash(s) == hash(Setting(s.to_dict()))
        with pytest.raises(KnobError, match=r"caching.toy_a.scale must be a float in \[0.5, 2.0\]"):
            Setting({"caching.toy_a": {"scale": 9}})
        calls[0] = 0
        with pytest.raises(TypeError, match="cannot be changed"):
            s["caching.toy_a"] = {"scale": 1.0}
        with pytest.raises(TypeError, match="cannot be changed"):
            s["caching.toy_a"]["scale"] = 1.0
        assert s["caching.toy_a"]["scale"] == 1.5 and s.without("tiling.toy_b") == {"caching.toy_a": {"scale": 1.5}}
        with pytest.raises(CompositionError):  # both claim decode.video
            check_composition(s)
        one = s.without("tiling.toy_b")
        check_request(one, tiny_request, "cpu")
        assert stages_touched(one) == ["decode_video"] and compile_signature(one) is None
        pipe = type("P", (), {"decode_video": lambda self, latent, rng: latent})()
        compose(pipe, one).undo()
        assert calls == [0]  # nothing validated again below the entry point
        assert one.with_values("caching.toy_a", {"scale": 2.0})["caching.toy_a"]["scale"] == 2.0 and calls == [1]
    finally:
        type(toy_a).check = original
    blob = pickle.dumps(s)
    unregister("caching.toy_a")  # (an actor's process need not hold a test's technique)
    back = pickle.loads(blob)
    assert type(back) is Setting and back == s
    with pytest.raises(TypeError):
        back["tiling.toy_b"]["on"] = False
