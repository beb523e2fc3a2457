"""A cheap estimate of a setting's whole-generation latency ratio: one transformer pass instead of whole stages.

A trial's full measure is pairs of whole generations (``evaluate_paired``). Most of a generation is transformer
passes of the same shapes: stage 1's eight (distilled) or its guided steps' passes at half resolution, stage 2's
three at full resolution. A technique that changes what each pass costs the same way at every step (a kernel, a
compile, FP8, a sparse attention past its dense steps) is measured here on **one replayed pass** per stage, at
the request's own shapes, interleaved with the baseline's pass (A B, B A, ...); the stages after the denoising
(the decoders) are timed alone from the stored baseline's latents. The model composes them:

    stage s (denoising): B_s + k_s * sum over its step classes c of  P_c * (t_setting,c - t_baseline,c)
    stage s (decoders):  B_s * median(setting / baseline) of the stage's own runs
    ratio = sum of the predicted stages / sum of B_s

where B_s is the stored baseline's median of stage s, P_c the passes of the steps of class c (the steps where
the setting's techniques act alike: a technique that keeps its first ``d`` steps dense splits a stage at ``d``),
and t the medians of the replayed pass (each timed right after an untimed one), scaled by
k_s = min(1, B_s / (the stage's passes x t_baseline)) into the stored baseline's units. A counted cache takes
off k_s * t_setting for each pass its own run served from the cache (less what a cached pass still costs).
Settings it cannot model (fewer steps, tiles, processes, a technique that does not say how it acts per pass) get
None and keep the full measure. The evaluator uses the estimate as the first rung of its successive halving (``prune``): a setting the
model says cannot win stops before any whole-generation pair; one that can is measured in full, the estimate
recorded beside the measured ratio (``paired["estimate"]``), so every campaign adds to the model's validation.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from typing import Any, Callable

import torch

from vidtune.model.generation import STAGES
from vidtune.search.stages import StoredStages, run_from
from vidtune.search.timing import StageTimer, interleaved
from vidtune.techniques.registry import get
from vidtune.techniques.setting import Setting, compose, stages_touched

__all__ = ["DENOISING", "SLACK", "estimate_errors", "estimator", "not_modelled", "step_classes", "capture_passes", "estimate", "predict"]

DENOISING = ("stage1", "stage2")
# The estimate stops a trial only when the ratio it gives, made this much better, still cannot win: the margin of
# the model's error (the target for it is 6% at worst against whole generations)
SLACK = 0.06


# One denoising stage's captured pass (at its middle step): "args" (video, audio, perturbations), "context", "passes_per_step"
CapturedPass = dict[str, Any]


class _Captured(Exception):
    """Raised by the capturing pass to end a run once the pass's inputs are held."""


def estimator(pipeline: Any, request: Any, values: Setting, baseline: Any, cache: dict[str, Any],
              pairs: int = 3, prune: bool = True, trust: bool = False) -> Callable[[Any], dict[str, Any]] | None:
    """``evaluate_paired``'s ``estimate`` for ``values`` (called with the setting's first output, whose statistics
    count a cache's passes); None where the model cannot estimate it, or where it touches no denoising stage (its
    stage-scoped pair runs the decoders alone: the estimate would cost as much). ``cache`` keeps the captured
    passes of this pipeline and request across trials. ``prune=False``: the estimate is recorded beside the pairs
    and stops nothing (``eval.estimate=record``: validation data from a campaign whose trials all get their pairs);
    ``trust``: a setting it does not stop is recorded at the estimate, without pairs (``eval.estimate=trust``)."""
    if not_modelled(values) is not None or not set(stages_touched(values)) & set(DENOISING):
        return None

    def run(out: Any) -> dict[str, Any]:
        if "passes" not in cache:
            cache["passes"] = capture_passes(pipeline, request, baseline.stages)
        # lean on a GPU: there it read as close as the full estimate at a third of its cost (6 settings at 1536x1024
        # on ltx2-19b, H100: results/latency_model/ltx2-19b-h100/); on a CPU a lone pass reads slow (multistep, ~40%)
        est = estimate(pipeline, request, values, baseline, pairs, cache["passes"], run_stats=out.stats,
                       lean=torch.device(pipeline.device).type == "cuda")
        return {**est, "slack": SLACK, "prune": prune, **({"trust": True} if trust else {})}

    return run


def not_modelled(values: Setting) -> str | None:
    """Why the model cannot estimate ``values`` (None: it can): a technique acting on a denoising stage must say
    how it acts per pass (``Technique.pass_steps``) or be a counted cache (``Technique.cached_pass_cost``), at most
    one cache a stage; one acting on the upsampler is out (its runs would run stage 2 whole)."""
    if "upsample" in stages_touched(values):
        return "it changes the upsampler, whose runs go through stage 2 whole"
    caches: dict[str, list[str]] = {}
    for name, v in values.items():
        tech = get(name)
        if tech.is_off(v):
            continue
        for stage in set(tech.stages_for(v)) & set(DENOISING):
            if tech.cached_pass_cost(v, 1) is not None:
                caches.setdefault(stage, []).append(name)
            elif tech.pass_steps(v, stage) is None:
                return f"{name} changes {stage} in a way one replayed pass does not show"
    for stage, names in sorted(caches.items()):
        if len(names) > 1:
            return f"{' and '.join(names)} both cache passes of {stage}: their cached passes overlap"
    return None


def _caches(values: Setting) -> dict[str, str]:
    """The counted cache of each denoising stage (``not_modelled`` allows one)."""
    out = {}
    for name, v in values.items():
        tech = get(name)
        if not tech.is_off(v) and tech.cached_pass_cost(v, 1) is not None:
            for stage in set(tech.stages_for(v)) & set(DENOISING):
                out[stage] = name
    return out


def step_classes(values: Setting, stage: str, num_steps: int) -> list[tuple[int, int]]:
    """The steps of ``stage`` grouped where every technique of ``values`` acts alike: (first step, steps in the
    class), in order. A technique keeping its first ``d`` steps as they are starts a class at ``d``."""
    starts = {0}
    for name, v in values.items():
        tech = get(name)
        if not tech.is_off(v) and stage in tech.stages_for(v) and tech.cached_pass_cost(v, 1) is None:
            d = tech.pass_steps(v, stage)
            if d is not None and 0 < d < num_steps:
                starts.add(d)
    firsts = sorted(starts)
    return [(s, (firsts[i + 1] if i + 1 < len(firsts) else num_steps) - s) for i, s in enumerate(firsts)]


def capture_passes(pipeline: Any, request: Any, stored: StoredStages) -> dict[str, CapturedPass]:
    """The inputs of a transformer pass of each denoising stage, at its middle step, and the stage's steps and
    passes per step: each stage started from the stored baseline and ended at that pass (no knob applied; the
    passes per step counted on the steps before it: one for the distilled steps, the guided passes for multistep).
    Why the middle step: a technique whose cost follows its input (Sol keeps the blocks the attention needs) sees a
    latent there that is neither the first step's noise nor the last step's near-final video."""
    captured: dict[str, CapturedPass] = {}
    before: dict[str, int] = {}  # each stage's passes before its middle step
    own = vars(pipeline).get("transformer_pass")  # (an instance attribute where a patch set one)
    run_pass = own if own is not None else pipeline.transformer_pass

    def capture(video: Any, audio: Any, perturbations: Any) -> Any:
        ctx = pipeline.context
        if ctx.step < ctx.num_steps // 2:
            before[ctx.stage] = before.get(ctx.stage, 0) + 1
            return run_pass(video, audio, perturbations)
        captured[ctx.stage] = {"args": (video, audio, perturbations), "context": ctx}
        raise _Captured

    pipeline.transformer_pass = capture
    try:
        for stage in DENOISING:
            try:
                run_from(pipeline, request, stage, stored if stage != "stage1" else None)
            except _Captured:
                continue  # (the stage ended at its captured pass, as intended: its later steps are not needed)
            raise RuntimeError(f"{stage} ran to its end without a pass to capture")
    finally:
        if own is None:
            del pipeline.transformer_pass  # (the class's method again)
        else:
            pipeline.transformer_pass = own
        pipeline.context = None
    for stage, c in captured.items():  # (counted, not derived from the guidance scales: a step's passes as run)
        mid = c["context"].num_steps // 2
        c["passes_per_step"] = before.get(stage, 0) / mid if mid else 1
    return captured


def _pass_ms(pipeline: Any, c: dict[str, Any], step: int, timed: int = 3, lead: int = 1) -> float:
    """The mean of ``timed`` replayed passes at ``step`` in a row, after ``lead`` untimed ones: in a stage's loop a
    pass follows a pass of the same shapes (on ltx2-mini's multistep CPU runs a lone replayed pass read ~40% above
    the loop's own per-pass time)."""
    ctx = c["context"]
    timer = StageTimer(pipeline.device)

    def passes(n: int) -> None:
        for _ in range(n):
            pipeline.enter_step(ctx.stage, step, ctx.num_steps, ctx.sigma, ctx.grid)
            pipeline.context = replace(pipeline.context, pass_name=ctx.pass_name)
            pipeline.transformer_pass(*c["args"])

    try:
        with torch.inference_mode():
            passes(lead)
            with timer:
                passes(timed)
    finally:
        pipeline.context = None
    return timer.elapsed_ms / timed


def estimate(pipeline: Any, request: Any, values: Setting, baseline: Any, pairs: int = 3,
             captured: dict[str, CapturedPass] | None = None, run_stats: dict[str, Any] | None = None,
             lean: bool = False) -> dict[str, Any] | None:
    """The model's estimate of ``values`` (None when ``not_modelled``): ``ratio`` (setting over baseline, whole
    generation), ``latency`` (each stage's predicted ms, as a record's), the replayed passes' and stage runs'
    medians. Everything it times runs in one round per side, after one untimed round of each (a compile or an
    autotune of the setting lands there), then ``pairs`` rounds A B, B A, ... ``captured``: ``capture_passes``'
    (captured here when None). ``run_stats``: a run of the setting's statistics (``GenerationOutput.stats``), where
    a counted cache recorded its cached passes; needed when ``values`` hold one. The caches are left out of the
    replayed passes: a cached pass saves ``1 - cached_pass_cost`` of the replayed pass of the setting. ``lean``: no
    untimed round and no untimed pass before a timed one (for a setting already warmed up, where a pass costs
    seconds. By the stage times of results/campaigns/h100-19b-1536i, 1536x1024x121 distilled on ltx2-19b: a stage-1
    pass 0.43 s, a stage-2 pass 2.2 s, a whole generation 12.3 s; the full estimate of a setting acting on both
    stages, 8 rounds of two passes a stage, comes to ~42 s, 1.7 whole pairs; the lean one, 6 rounds of one pass a
    stage, ~16 s. Arithmetic, not timed)."""
    if not_modelled(values) is not None:
        return None
    t0 = time.perf_counter()
    touched = stages_touched(values)
    denoising = [s for s in DENOISING if s in touched]
    later = [s for s in touched if s not in DENOISING]
    caches = _caches(values)
    if caches and run_stats is None:
        raise ValueError(f"estimating {sorted(set(caches.values()))} needs a run of the setting's statistics (run_stats)")
    replayed = values.without(*set(caches.values()))
    if denoising and captured is None:
        captured = capture_passes(pipeline, request, baseline.stages)
    n_steps = {stage: captured[stage]["context"].num_steps for stage in denoising}
    # 3 passes in a row where a stage has many (a guided stage 1's 160 multiply each one's noise), else 1
    timed = {stage: 3 if n_steps[stage] * captured[stage]["passes_per_step"] > 16 else 1 for stage in denoising}
    items = [(stage, first, steps) for stage in denoising for first, steps in step_classes(values, stage, n_steps[stage])]

    def one_round() -> dict[Any, float]:
        ms: dict[Any, float] = {(stage, first): _pass_ms(pipeline, captured[stage], first, timed[stage], 0 if lean else 1)
                                for stage, first, _ in items}
        if later:  # (the decoders: run from the first of them on the stored baseline's latents)
            ms.update(run_from(pipeline, request, later[0], baseline.stages)[1])
        return ms

    # (b first: its untimed run takes a compile or an autotune, then b a | a b, b a, ... with b's runs in a row
    # under one application)
    rounds = interleaved(("b", "a"), pairs, lambda side: compose(pipeline, replayed).undo if side == "b" else None,
                         lambda side: one_round(), untimed=0 if lean else 1)
    a_rounds, b_rounds = rounds["a"], rounds["b"]
    base = {s: baseline.latency[s]["median_ms"] for s in STAGES if s in baseline.latency}
    predicted = dict(base)
    measured: dict[str, Any] = {}
    scale: dict[str, float] = {}
    acting = set(stages_touched(replayed))  # (a stage only a cache acts on: its replayed pass is the baseline's)
    for stage, first, steps in items:
        a = statistics.median(r[(stage, first)] for r in a_rounds)
        b = statistics.median(r[(stage, first)] for r in (b_rounds if stage in acting else a_rounds))
        passes = steps * captured[stage]["passes_per_step"]
        # the replayed pass in the stored baseline's units: never above the stage's own time per pass (a replay that
        # reads slower than the loop's passes, or a machine slower now than when the baseline was stored)
        k = scale.setdefault(stage, min(1.0, base[stage] / (captured[stage]["passes_per_step"] * n_steps[stage] * a)))
        predicted[stage] += passes * k * (b - a)
        measured.setdefault(stage, {"pass": [], "scale": round(k, 4)})["pass"].append(
            {"first_step": first, "steps": steps, "passes": passes, "baseline_ms": round(a, 3), "setting_ms": round(b, 3)})
    for stage, name in caches.items():  # (a cache acts from its first cached step on: the last class's pass)
        cached = ((run_stats or {}).get(name) or {}).get(stage, {}).get("cached", 0)
        blocks = len(pipeline.transformer_for(stage).velocity_model.transformer_blocks)
        cost = get(name).cached_pass_cost(values[name], blocks)
        b = measured[stage]["pass"][-1]["setting_ms"]
        predicted[stage] -= cached * (1.0 - cost) * scale[stage] * b
        measured[stage]["cache"] = {"technique": name, "cached_passes": cached, "cached_pass_cost": round(cost, 4)}
    for stage in later:
        ratio = statistics.median(b[stage] / a[stage] for a, b in zip(a_rounds, b_rounds))
        predicted[stage] = base[stage] * ratio
        measured[stage] = {"ratio": round(ratio, 4), "baseline_ms": [round(r[stage], 3) for r in a_rounds],
                           "setting_ms": [round(r[stage], 3) for r in b_rounds]}
    return {**predict(base, predicted, measured, pairs), "seconds": round(time.perf_counter() - t0, 3),
            **({"lean": True} if lean else {})}


def estimate_errors(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What a campaign's records say of the model: trials estimated, stopped by their estimate, and the error
    (estimate / measured - 1) over those measured in full (2 pairs or more), and those recorded at their estimate
    (``eval.estimate=trust``: no pair, not stopped); None when nothing was estimated."""
    paired = [r["paired"] for r in records if (r.get("paired") or {}).get("estimate")]
    if not paired:
        return None
    errors = [abs(p["estimate"]["ratio"] / p["ratio"] - 1) for p in paired if p.get("repeats", 0) >= 2]
    return {"estimated": len(paired), "stopped": sum(p.get("repeats") == 0 and "pruned" in p for p in paired),
            "trusted": sum(p.get("repeats") == 0 and "pruned" not in p for p in paired), "measured": len(errors),
            "median": statistics.median(errors) if errors else None, "worst": max(errors) if errors else None}


def predict(base: dict[str, float], predicted: dict[str, float], measured: dict[str, Any], pairs: int) -> dict[str, Any]:
    """The estimate's record from the stored baseline's stage medians and the predicted ones (a stage is never
    predicted below 0: a cache's saving, at a replayed pass's time, can exceed the stage's stored time)."""
    predicted = {s: max(ms, 0.0) for s, ms in predicted.items()}
    total, base_total = sum(predicted.values()), sum(base.values())
    return {"ratio": total / base_total, "total_ms": total,
            "latency": {s: {"median_ms": round(ms, 3), "source": "estimate" if s in measured else "baseline"}
                        for s, ms in predicted.items()},
            "measured": measured, "pairs": pairs,
            "method": "replayed transformer passes per denoising stage and step class (each timed after an untimed "
                      "one, scaled into the stored baseline's units), a counted cache's passes off, the decoders' own "
                      "runs; interleaved with the baseline's (A B, B A, ...) after an untimed round of each; stage "
                      "medians of the stored baseline for the rest"}
