"""The conformance checks every registered technique must pass (docs/architecture.md: adding a technique), as plain functions.

tests/test_techniques_conformance.py runs them over every technique (and, for the parallelism family, in
a 2-process gloo world), and runs each against a deliberately broken technique to show it can fail.
Each check raises ``AssertionError`` with what went wrong.
"""

from __future__ import annotations

from typing import Any

import optuna
import torch

from vidtune.model import ReferencePipeline
from vidtune.techniques import KnobError
from vidtune.techniques.seams import SEAMS, overlap, seam_of

IGNORED_ATTRS = ("stats", "records", "context", "_stage2_grid", "_prompt_cache", "applied_info", "_serial")


def pipeline_state(pipeline: ReferencePipeline) -> dict:
    """Identity of everything a technique may patch: pipeline attributes, module attributes, weights."""
    state: dict[str, Any] = {"attrs": {k: id(v) for k, v in vars(pipeline).items() if k not in IGNORED_ATTRS}}
    for i, transformer in enumerate(pipeline.transformers()):
        state[f"modules{i}"] = {n: (type(m), {k: id(v) for k, v in vars(m).items()})
                                for n, m in transformer.named_modules()}
        state[f"weights{i}"] = {k: _fingerprint(v) for k, v in transformer.state_dict().items()}
    return state


def _fingerprint(t: torch.Tensor) -> tuple:
    """A weight as undo must leave it: dtype, shape, strides and every bit of its values (not its address: a
    technique that moves a weight off the device and back, memory.fp8_weights, restores it in new storage)."""
    import hashlib

    data = t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return t.dtype, tuple(t.shape), t.stride(), hashlib.sha1(data).hexdigest()


def same_output(out: Any, reference: Any) -> bool:
    return torch.equal(out.frames, reference.frames) and torch.equal(out.audio, reference.audio)


def valid_samples(technique: Any, seed: int, count: int) -> list[dict]:
    """Random samples of the knob domains that pass cross-knob validation (invalid ones must say why)."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    valid = []
    for _ in range(count):
        trial = study.ask()
        values = {k.name: k.suggest(trial, f"{technique.name}.{k.name}") for k in technique.knobs}
        try:
            full = technique.validate(values)
        except KnobError as err:  # a cross-knob constraint: the message names the technique's knob
            assert str(err).startswith(technique.name + ".") or technique.name + ":" in str(err), str(err)
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            continue
        assert set(full) == {k.name for k in technique.knobs}
        valid.append(values)
        study.tell(trial, 0.0)
    return valid


def check_off(technique: Any, models: Any, request: Any, reference: Any, **pipeline_kwargs: Any) -> None:
    """Every knob at its off value: the output is the reference's, bit for bit."""
    pipe = ReferencePipeline(models, **pipeline_kwargs)
    with technique.apply(pipe, technique.off_values()):
        assert same_output(pipe.run(request), reference), f"{technique.name}: off is not bit-identical"


def check_neutral(technique: Any, models: Any, request: Any, reference: Any, **pipeline_kwargs: Any) -> bool:
    """The technique's active-but-neutral setting installs its patch and keeps the output bit-identical.

    Returns False where the technique has no such setting here (it must then say why in ``inexact``,
    or be a parallelism technique outside a world)."""
    pipe = ReferencePipeline(models, **pipeline_kwargs)
    values = technique.neutral(request, pipe.device)
    if values is None:
        assert technique.inexact or technique.family == "parallelism", \
            f"{technique.name}: no neutral setting and no reason in `inexact`"
        return False
    assert not technique.is_off(values), f"{technique.name}: its neutral setting {values} is off: nothing is tested"
    technique.check_request(technique.validate(values), request)
    technique.check_device(technique.validate(values), pipe.device)
    patch = technique.apply(pipe, values)
    try:
        assert patch.touched or technique.name in pipe.applied_info, \
            f"{technique.name}: the neutral setting {values} installed nothing"
        assert same_output(pipe.run(request), reference), \
            f"{technique.name}: the neutral setting {values} changed the output"
    finally:
        patch.undo()
    return True


def check_apply_undo(technique: Any, models: Any, request: Any, reference: Any, samples: list[dict],
                     **pipeline_kwargs: Any) -> int:
    """Apply then undo restores the pipeline (state and output), for each sample this request and device
    can run. Returns how many samples were applied."""
    pipe = ReferencePipeline(models, **pipeline_kwargs)
    before = pipeline_state(pipe)
    applied = 0
    for values in samples:
        try:
            technique.check_request(technique.validate(values), request)
            technique.check_device(technique.validate(values), pipe.device)
        except KnobError:
            continue  # not applicable to this request's latent size or this device
        patch = technique.apply(pipe, values)
        pipe.run(request)
        patch.undo()
        patch.undo()  # a second undo is harmless
        assert pipeline_state(pipe) == before, f"{technique.name}: undo of {values} left the pipeline changed"
        applied += 1
    assert same_output(pipe.run(request), reference), f"{technique.name}: output changed after apply and undo"
    return applied


def check_bad_values(technique: Any) -> None:
    """Unknown knobs and out-of-domain values raise a KnobError naming the knob and what is allowed."""
    try:
        technique.validate({"definitely_not_a_knob": 1})
    except KnobError as err:
        assert "has no knob" in str(err), str(err)
    else:
        raise AssertionError(f"{technique.name}: an unknown knob was accepted")
    for k in technique.knobs:
        bad_values = [{"categorical": "not-a-choice", "bool": "maybe", "int": "x", "float": float("nan")}[k.kind]]
        if k.kind in ("int", "float"):
            bad_values.append(k.high + 1)
        for bad in bad_values:
            try:
                technique.validate({k.name: bad})
            except KnobError as err:
                assert f"{technique.name}.{k.name}" in str(err) and "must be" in str(err), str(err)
            else:
                raise AssertionError(f"{technique.name}.{k.name}={bad!r} was accepted")


def touched_seams(pipeline: Any, patch: Any) -> set[str]:
    """The seams of the attributes ``patch`` set on ``pipeline`` and its modules."""
    return {seam_of(pipeline, obj, attr) for obj, attr in patch.touched}


def check_seams(technique: Any, models: Any, request: Any, settings: list[dict], **pipeline_kwargs: Any) -> int:
    """Each declared seam is declared in techniques/seams.py, and every attribute a setting's patch sets
    belongs to a seam the technique declares (equal to, inside or around it). Returns the settings applied."""
    for seam in technique.seams:
        assert seam in SEAMS, f"{technique.name}: undeclared seam {seam!r}"
    pipe = ReferencePipeline(models, **pipeline_kwargs)
    applied = 0
    for values in settings:
        try:
            technique.check_request(technique.validate(values), request)
            technique.check_device(technique.validate(values), pipe.device)
            patch = technique.apply(pipe, values)
        except KnobError:
            continue
        try:
            for seam in touched_seams(pipe, patch):
                assert any(seam in SEAMS and overlap(seam, d) for d in technique.seams), \
                    f"{technique.name} patched {seam!r} with {values}, but declares only {list(technique.seams)}"
        finally:
            patch.undo()
        applied += 1
    return applied


def parallel_conformance(rank: int, world: int, names: list[str]) -> dict[str, dict]:
    """In a world of processes: each parallelism technique's neutral setting against a one-process run of
    the same request in this rank, then apply/undo and the seams it touched (``launch`` calls this)."""
    from vidtune.model import GenerationRequest, ModelSource, load_models
    from vidtune.model.tiles import Stage2Tiling
    from vidtune.techniques import get

    models = load_models(ModelSource(preset="tiny"))
    base = dict(prompt="a red circle bouncing", seed=7, height=256, width=384, frames=17, fps=24.0)
    out: dict[str, dict] = {}
    for name in names:
        tech = get(name)
        request = GenerationRequest(**base, mode="multistep", steps=2) if "guidance" in name else GenerationRequest(**base)
        kwargs = {"stage2_tiling": Stage2Tiling(rows=2, cols=2, overlap=2)} if "tile" in name else {}
        reference = ReferencePipeline(models, **kwargs).run(request)
        res: dict[str, Any] = {}
        try:
            res["neutral"] = check_neutral(tech, models, request, reference, **kwargs)
            values = tech.neutral(request, torch.device("cpu"))
            res["applied"] = check_apply_undo(tech, models, request, reference, [values], **kwargs)
            res["seams_applied"] = check_seams(tech, models, request, [values], **kwargs)
            res["ok"] = True
        except AssertionError as err:
            res["ok"], res["error"] = False, str(err)
        out[name] = res
    return out
