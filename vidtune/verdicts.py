"""The campaign's tier verdicts over several clips (search/verdict.py says why): before the final bench, each
tier's chosen setting is measured on the spec's other clips (seeds and prompts) and keeps the tier only if the
worst of every metric over them and the campaign's own clip passes the tier's gate; otherwise the tier's next
candidate (fastest first) is tried, up to ``spec.verdict_candidates`` measured for the tier (one whose clips are
recorded already costs nothing and is not counted; one holding every knob of a candidate that did not hold is
skipped), then the tier exports the baseline.

Each setting's clips are measured once and recorded in trials.jsonl (phase ``verdict``), so a resumed campaign
and another tier with the same setting read them instead of measuring again."""

from __future__ import annotations

import time
from typing import Any

from vidtune.integrator.combine import combo_key
from vidtune.search.records import Status
from vidtune.search.verdict import spread, worst
from vidtune.techniques.setting import Setting

__all__ = ["hold_verdicts", "stricter_if_faster"]


def _describe(change: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v!r}" for k, v in change.items())


def hold_verdicts(driver: Any, pool: Any, tiers: Any, candidates: dict[Any, list[dict[str, Any]]]
                  ) -> tuple[dict[Any, Setting], dict[Any, dict[str, Any]]]:
    """Each tier's setting: the first of its ``candidates`` (the integrator's ``ranked``: gated, faster, fastest
    first) that holds on the spec's other clips, or the baseline; and the verdict of each tier: the clips, the worst
    over them, the spread, and the candidates that did not hold. Without clips in the spec, each tier's first."""
    spec, log = driver.spec, driver.log
    clips = [dict(c) for c in spec.verdict_clips]
    if not clips:
        return {tier: Setting.of(c[0]["knobs"] if c else {}) for tier, c in candidates.items()}, {}
    recorded = {r["combo"]: r["result"] for r in driver._records("integrator") if r.get("phase") == "verdict"}

    def measured(knobs: Setting) -> list[dict[str, Any]]:
        key = combo_key(knobs)
        if key not in recorded:
            t0 = time.time()
            res = pool.get(pool.actors[0].verdict.remote(knobs, clips))
            driver._append({"family": "integrator", "phase": "verdict", "combo": key, "knobs": knobs, "result": res,
                            "wall_s": round(time.time() - t0, 3), "time": time.time()})
            log(f"integrator: {knobs} measured on {len(clips)} more clip(s) in {time.time() - t0:.0f} s")
            recorded[key] = res
        return recorded[key]

    out_choices, verdicts = {}, {}
    for tier, gate in tiers:
        label = f"tier {tier}: " if tier else ""
        did_not_hold: list[dict[str, Any]] = []
        chosen: Setting = Setting.of({})
        verdict: dict[str, Any] = {}
        new = 0  # candidates measured for this tier (those recorded already, for another tier or an earlier run, are free)
        for e in candidates[tier]:
            knobs = Setting.of(e["knobs"])
            # one holding every knob of a candidate whose quality did not hold would most likely fail the same way
            # (campaign h100-19b-1536k: three candidates with the same step skip each failed on the audio, and the
            # budget of candidates was spent before a setting without it that held)
            within = next((d for d in did_not_hold if d.get("worst") and _holds_all(knobs, d["knobs"])), None)
            if within is not None:
                did_not_hold.append({"knobs": knobs, "reason": f"not measured: it holds every knob of {within['knobs']}, "
                                     f"which did not hold", "worst": None, "skipped": True})
                continue
            if combo_key(knobs) not in recorded:
                if new >= spec.verdict_candidates:
                    break
                new += 1
            per_clip = measured(knobs)
            failed = [c for c in per_clip if c.get("status") != Status.OK or not c.get("quality")]
            qualities = [e["quality"], *(c["quality"] for c in per_clip if c not in failed)]
            low = worst(qualities)
            if not failed and gate.passes(low):
                chosen = knobs
                verdict = {"clips": 1 + len(clips), "changes": clips, "worst": low, "spread": spread(qualities)}
                break
            why = (f"its run failed on {_describe(failed[0]['change'])} ({failed[0].get('reason')})" if failed else
                   f"over {1 + len(clips)} clips its worst is {gate.shortfall(low)}")
            log(f"integrator: {label}{knobs} passes on the campaign's clip but does not hold: {why}")
            did_not_hold.append({"knobs": knobs, "reason": why, "worst": None if failed else low})
        if did_not_hold and not chosen:
            log(f"integrator: {label}no candidate holds on every clip ({sum(1 for d in did_not_hold if d['worst'])} "
                f"did not hold, {new} measured for this tier, at most {spec.verdict_candidates}); the tuned config is "
                f"the baseline")
        out_choices[tier] = chosen
        verdicts[tier] = {**verdict, "did_not_hold": did_not_hold}
    return out_choices, verdicts


def _holds_all(knobs: Setting, other: Setting) -> bool:
    """Whether ``knobs`` applies every technique of ``other`` at the same values."""
    return all(knobs.get(name) == values for name, values in other.items())


def stricter_if_faster(tier: Any, gate: Any, own: dict[str, Any], stricter: dict[Any, dict[str, Any]], log: Any
                       ) -> dict[str, Any]:
    """What tier ``tier`` exports: its ``own`` outcome (chosen, final, rejected, verdict), or a stricter tier's
    (``stricter``: the outcomes exported before it, strictest first) where that setting passes this tier's gate
    too, on the worst over its verdict's clips (else its final's quality), and its final bench measured faster.
    The tiers' settings are benched together against the same baseline runs, so their speed-ups compare. (The
    default campaign's `balanced` exported step skipping + compile at x1.276 beside `high`'s compile alone at
    x1.350, which passes `balanced`'s gate: a looser tier must not export a slower setting.)"""
    def speed(o: dict[str, Any]) -> float:  # (the baseline's "speed-up" against itself is noise: 1)
        return o["final"]["speedup"] if o["chosen"] else 1.0

    best = own
    for name, o in stricter.items():
        quality = (o.get("verdict") or {}).get("worst") or o["final"]["quality"]
        if o["chosen"] and speed(o) > speed(best) and gate.passes(quality):
            best = {**o, "from": name}
    if best is not own:
        log(f"integrator: tier {tier}: the {best['from']} tier's {best['chosen']} passes this tier's gate too and "
            f"measured faster (x{speed(best):.3f} against x{speed(own):.3f}): exported here too")
    return best
