"""The integrator: combinations of the families' survivors, gated by quality, fastest one chosen.

One candidate or none per family; combinations whose techniques claim the same seam are rejected by
``check_composition`` before any work. Every combination is evaluated end to end (all stages) against
the baseline; the fastest one that passes the gate is re-measured with more repeats, interleaved
with the baseline (A B A B) in one worker, and exported as the tuned config.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from vidtune.techniques.registry import CompositionError, KnobError, check_composition

__all__ = ["combinations", "integrate", "keep_if_faster", "smallest_p_value", "speedup_p_value"]


def _merge(parts: tuple[dict | None, ...]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for p in parts:
        if p:
            out.update(p)
    return out


def combinations(survivors: dict[str, list[dict[str, Any]]]) -> list[dict[str, dict[str, Any]]]:
    """Every valid combination of at most one survivor per family (the empty one excluded)."""
    options = [[None, *[s["knobs"] for s in survivors[f]]] for f in sorted(survivors)]
    out, seen = [], set()
    for parts in itertools.product(*options):
        setting = _merge(parts)
        if not setting:
            continue
        key = repr(sorted((k, sorted(v.items())) for k, v in setting.items()))
        if key in seen:
            continue
        seen.add(key)
        try:
            check_composition(setting)
        except (CompositionError, KnobError):
            continue
        out.append(setting)
    return out


def _evaluate_all(pool: Any, settings: list[dict]) -> list[dict[str, Any]]:
    ray = pool.ray
    results: list[dict[str, Any] | None] = [None] * len(settings)
    queue = list(enumerate(settings))
    in_flight: dict[Any, tuple[int, Any]] = {}
    free = list(pool.actors)
    while queue or in_flight:
        while queue and free:
            i, setting = queue.pop(0)
            actor = free.pop()
            in_flight[actor.evaluate.remote(setting, False)] = (i, actor)
        ready = pool.wait(list(in_flight))
        for ref in ready:
            i, actor = in_flight.pop(ref)
            try:
                results[i] = ray.get(ref)
            except Exception as exc:
                results[i] = {"status": "fail", "reason": "actor-died", "message": str(exc)[:500]}
                actor = pool.replace(actor)
            free.append(actor)
    return results  # type: ignore[return-value]


def _search(pool: Any, survivors: dict[str, list[dict]], spec: Any) -> tuple[list[dict], list[dict]]:
    """Too many combinations to try all: an Optuna study over one candidate index per family.

    Objective: latency (minimise) with the gate as a constraint; as many trials at a time as actors.
    """
    import optuna

    from vidtune.search.campaign import set_constraints

    families = sorted(survivors)
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=spec.seed))
    combos: list[dict] = []
    results: list[dict] = []
    while len(combos) < spec.integrator_trials:
        batch = []
        for _ in range(min(len(pool.actors), spec.integrator_trials - len(combos))):
            trial = study.ask()
            parts = []
            for f in families:
                i = trial.suggest_int(f"{f}.candidate", -1, len(survivors[f]) - 1)  # -1: none of this family
                parts.append(survivors[f][i]["knobs"] if i >= 0 else None)
            setting = _merge(tuple(parts))
            try:
                check_composition(setting)
            except (CompositionError, KnobError):
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            batch.append((trial, setting))
        if not batch:
            continue
        outs = _evaluate_all(pool, [s for _, s in batch])
        for (trial, setting), res in zip(batch, outs):
            combos.append(setting)
            results.append(res)
            if res.get("status") == "ok":
                set_constraints(trial, [spec.gate.psnr_db - res["quality"]["psnr_db"]])
                study.tell(trial, res["total_ms"])
            else:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
    return combos, results


def integrate(campaign: Any, pool: Any, survivors: dict[str, list[dict]], baseline: dict[str, Any]) -> dict[str, Any]:
    """Search the combinations, pick the fastest gated one, re-measure it interleaved, export it."""
    from vidtune.integrator.tuned import export_tuned_config

    spec, log = campaign.spec, campaign.log
    combos = combinations(survivors)
    log(f"integrator: {len(combos)} combination(s) of {sum(len(v) for v in survivors.values())} survivor(s)")
    if len(combos) > spec.integrator_max_exhaustive:
        combos, results = _search(pool, survivors, spec)
    else:
        results = _evaluate_all(pool, combos) if combos else []
    evaluated = []
    for setting, res in zip(combos, results):
        ok = res.get("status") == "ok" and spec.gate.passes(res["quality"])
        evaluated.append({"knobs": setting, "status": res.get("status"), "passes_gate": ok,
                          "total_ms": res.get("total_ms"), "quality": res.get("quality"),
                          "reason": res.get("reason"), "message": res.get("message")})
        campaign._append({"family": "integrator", **{k: v for k, v in res.items() if k != "traceback"}, "knobs": setting,
                          "passes_gate": ok})
    passing = sorted((e for e in evaluated if e["passes_gate"]), key=lambda e: e["total_ms"])
    chosen = passing[0]["knobs"] if passing else {}
    if not passing:
        log("integrator: no combination passes the gate; the tuned config is the baseline (no techniques)")
    def bench(knobs: dict) -> dict[str, Any]:
        return pool.get(pool.actors[0].bench.remote(knobs, spec.final_repeats, str(spec.directory / "tuned")))

    chosen, final, rejected = keep_if_faster(chosen, bench(chosen), bench, log, spec.integrator_max_p)
    what = f"{chosen}: x{final['speedup']:.3f} vs baseline, p={final['p_value']:.3g}" if chosen else (
        f"baseline (no techniques): x{final['speedup']:.3f} against itself (the measurement's noise)")
    log(f"tuned: {what} (interleaved, {spec.final_repeats} repeats), PSNR {final['quality']['psnr_db']:.2f} dB")
    path = export_tuned_config(spec, chosen, final, baseline, rejected=rejected)
    log(f"tuned config: {path}")
    return {"integrator": evaluated, "chosen": chosen, "final": final, "rejected": rejected, "tuned_config": str(path)}


def smallest_p_value(repeats: int) -> float:
    """The smallest one-sided Mann-Whitney U p-value ``repeats`` baseline and ``repeats`` tuned runs can
    give (every tuned run faster than every baseline run): 1 / C(2n, n)."""
    return 1.0 / math.comb(2 * repeats, repeats)


def speedup_p_value(baseline_ms: list[float], tuned_ms: list[float]) -> float:
    """One-sided Mann-Whitney U p-value of "tuned runs are faster than baseline runs" (exact for small
    samples; no normality assumed, which whole-pipeline timings on a shared host do not have)."""
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(tuned_ms, baseline_ms, alternative="less", method="exact").pvalue)


def keep_if_faster(chosen: dict, final: dict[str, Any], bench: Any, log: Any, max_p: float = 0.05
                   ) -> tuple[dict, dict[str, Any], dict[str, Any] | None]:
    """The interleaved re-measurement has the last word. A combination is exported only if it comes out
    faster than the baseline there *and* the difference stands out of the run-to-run noise: the
    one-sided Mann-Whitney p-value over the interleaved repeats is at most ``max_p`` (1: the median
    ratio alone decides). Why: on the H200 a combination that changed nothing (its output bit-identical,
    no pass cached) measured x1.096 with 3 repeats, the baseline itself spreading 3.16-3.67 s. Otherwise
    the tuned config is the baseline, re-measured the same way, and the rejected candidate is recorded
    with the reason."""
    if not chosen:
        return chosen, final, None
    p = speedup_p_value(final["baseline_total_ms"], final["tuned_total_ms"])
    final = {**final, "p_value": p}
    if final["speedup"] >= 1.0 and (max_p >= 1 or p <= max_p):
        return chosen, final, None
    if final["speedup"] < 1.0:
        why = f"slower than the baseline when re-measured interleaved (x{final['speedup']:.3f})"
    else:
        why = (f"not significantly faster than the baseline when re-measured interleaved (x{final['speedup']:.3f}, "
               f"one-sided Mann-Whitney p={p:.3g} > {max_p:g})")
    log(f"integrator: the fastest gated combination was {why}; the tuned config is the baseline (no techniques)")
    rejected = {"knobs": chosen, "speedup": final["speedup"], "p_value": p, "max_p_value": max_p, "reason": why,
                "baseline_total_ms": final["baseline_total_ms"], "tuned_total_ms": final["tuned_total_ms"],
                "psnr_db": final["quality"]["psnr_db"]}
    return {}, bench({}), rejected
