"""The conformance suite: every registered technique passes these checks automatically (STYLE.md 2).

A new technique gets: off == reference bit for bit, every knob's domain samples and validates, apply
then undo restores the pipeline (state and output), and bad values raise a clear KnobError.
"""

from __future__ import annotations

import optuna
import pytest
import torch

from vidtune.model import ReferencePipeline
from vidtune.techniques import FAMILIES, KnobError, registered

TECHNIQUES = registered()
IDS = [t.name for t in TECHNIQUES]


def _state(pipeline: ReferencePipeline) -> dict:
    """Identity of everything a technique may patch: pipeline attributes, module attributes, weights."""
    modules = {n: (type(m), dict(vars(m))) for n, m in pipeline.models.transformer.named_modules()}
    weights = {k: v.data_ptr() for k, v in pipeline.models.transformer.state_dict().items()}
    attrs = {k: v for k, v in vars(pipeline).items() if k not in ("stats", "records", "context", "_stage2_grid", "_prompt_cache", "applied_info")}
    return {"modules": {n: (t, {k: id(v) for k, v in d.items()}) for n, (t, d) in modules.items()},
            "weights": weights, "attrs": {k: id(v) for k, v in attrs.items()},
            "methods": {k: id(v) for k, v in vars(pipeline).items() if callable(v)}}


def test_families_declared():
    assert FAMILIES == ("caching", "sparse_attention", "tiling", "kernel_choice", "parallelism")
    assert TECHNIQUES, "at least one technique is registered"
    for t in TECHNIQUES:
        assert t.family in FAMILIES and t.name.startswith(t.family + ".")
        assert t.knobs and t.stages and t.seams


@pytest.mark.parametrize("technique", TECHNIQUES, ids=IDS)
def test_off_is_bit_identical(technique, tiny_models, tiny_request, tiny_reference_output):
    pipe = ReferencePipeline(tiny_models)
    with technique.apply(pipe, technique.off_values()):
        out = pipe.run(tiny_request)
    assert torch.equal(out.frames, tiny_reference_output.frames)
    assert torch.equal(out.audio, tiny_reference_output.audio)


def _valid_samples(technique, seed: int, count: int) -> list[dict]:
    """Random samples of the knob domains that pass cross-knob validation (invalid ones must say why)."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    valid = []
    for _ in range(count):
        trial = study.ask()
        values = {k.name: k.suggest(trial, f"{technique.name}.{k.name}") for k in technique.knobs}
        try:
            full = technique.validate(values)
        except KnobError as err:  # a cross-knob constraint: the message names the technique's knob
            assert str(err).startswith(technique.name + ".") or technique.name + ":" in str(err)
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            continue
        assert set(full) == {k.name for k in technique.knobs}
        valid.append(values)
        study.tell(trial, 0.0)
    return valid


@pytest.mark.parametrize("technique", TECHNIQUES, ids=IDS)
def test_domains_sample_and_validate(technique):
    assert len(_valid_samples(technique, 0, 30)) >= 5
    for k in technique.knobs:
        assert k.validate(k.off) == k.off


@pytest.mark.parametrize("technique", TECHNIQUES, ids=IDS)
def test_apply_then_undo_restores(technique, tiny_models, tiny_request, tiny_reference_output):
    pipe = ReferencePipeline(tiny_models)
    before = _state(pipe)
    for values in _valid_samples(technique, 1, 30)[:3]:
        try:
            technique.check_request(technique.validate(values), tiny_request)
            technique.check_device(technique.validate(values), pipe.device)
        except KnobError:
            continue  # not applicable to this request's latent size or this device
        patch = technique.apply(pipe, values)
        pipe.run(tiny_request)
        patch.undo()
        patch.undo()  # a second undo is harmless
        assert _state(pipe) == before
    out = pipe.run(tiny_request)
    assert torch.equal(out.frames, tiny_reference_output.frames)


@pytest.mark.parametrize("technique", TECHNIQUES, ids=IDS)
def test_bad_values_raise_clear_errors(technique):
    with pytest.raises(KnobError, match="has no knob"):
        technique.validate({"definitely_not_a_knob": 1})
    for k in technique.knobs:
        bad = {"categorical": "not-a-choice", "bool": "maybe", "int": "x", "float": float("nan")}[k.kind]
        with pytest.raises(KnobError) as err:
            technique.validate({k.name: bad})
        assert f"{technique.name}.{k.name}" in str(err.value) and "must be" in str(err.value)
        if k.kind in ("int", "float"):
            with pytest.raises(KnobError, match=f"{technique.name}.{k.name} must be"):
                technique.validate({k.name: k.high + 1})
