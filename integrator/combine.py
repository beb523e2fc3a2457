"""The integrator: combinations of the families' survivors, gated by quality, fastest one chosen.

One candidate or none per family; combinations whose techniques claim the same seam are rejected by
``check_composition`` before any work. A family's candidates are its survivors and, with ``merge``, the
merges of two of them (``family_candidates``): a family's Pareto front often holds settings that use
different techniques of the family (campaign h200-19b-1536d: FP8 + compile + fused norms in one survivor,
the SDPA backends + the compiled VAE decode in the other), and the union is what a person would try next.
``CombinationSearch`` says which combinations to evaluate; the campaign driver (vidtune/driver.py)
dispatches them to its actors like the families' trials, records each as it finishes and tells the search
(a resume tells it the recorded ones first). Each is evaluated against the baseline, stage-scoped (from the first stage its knobs touch); the fastest one that passes
the gate is re-measured with more repeats, interleaved with the baseline (A B B A) in one worker, and
kept only if it is faster beyond the noise (``keep_if_faster``).
"""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

from vidtune.search.records import Status
from vidtune.techniques.registry import KnobError
from vidtune.techniques.setting import (CompositionError, KnobValues, Setting, SettingLike, check_composition,
                                        compile_signature)

__all__ = ["CombinationSearch", "choose", "combinations", "combo_key", "family_candidates", "keep_if_faster",
           "smallest_p_value", "speedup_p_value"]


def _merge(parts: tuple[dict | None, ...]) -> KnobValues:
    out: KnobValues = {}
    for p in parts:
        if p:
            out.update(p)
    return out


def family_candidates(front: list[dict[str, Any]], *, merge: bool = True,
                      baseline_ms: float | None = None) -> list[dict[str, Any]]:
    """A family's candidates for the integrator: its survivors (fastest first), then, with ``merge``, for
    every ordered pair (a, b) of them the merge ``a`` + the techniques of ``b`` that ``a`` does not set (``a``'s
    values win where both set a technique; both orders, so either side's value gets its chance). A merge that
    adds nothing to ``a``, repeats a candidate or does not compose is left out. A merge is predicted, never
    measured here: ``total_ms`` is the product of its parts' speed-ups at ``baseline_ms`` (the slower part's
    latency without it), ``psnr_db`` the lower of the two, ``merged_from`` names the two trials."""
    out = list(front)
    if not merge or len(front) < 2:
        return out
    seen = {combo_key(s["knobs"]) for s in front}
    for a, b in itertools.permutations(front, 2):
        knobs = {**a["knobs"], **{t: v for t, v in b["knobs"].items() if t not in a["knobs"]}}
        key = combo_key(knobs)
        if len(knobs) == len(a["knobs"]) or key in seen:
            continue
        try:
            check_composition(knobs)
        except (CompositionError, KnobError):
            continue
        seen.add(key)
        total = (a["total_ms"] * b["total_ms"] / baseline_ms if baseline_ms
                 else max(a["total_ms"], b["total_ms"]))
        out.append({"trial": None, "knobs": knobs, "total_ms": total, "psnr_db": min(a["psnr_db"], b["psnr_db"]),
                    "merged_from": [a.get("trial"), b.get("trial")]})
    return out


def combinations(candidates: dict[str, list[dict[str, Any]]]) -> list[Setting]:
    """Every valid combination of at most one candidate per family (the empty one excluded); a family's
    candidates are its survivors, or ``family_candidates`` of them."""
    options = [[None, *[s["knobs"] for s in candidates[f]]] for f in sorted(candidates)]
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
            setting = Setting(setting)
            check_composition(setting)
        except (CompositionError, KnobError):
            continue
        out.append(setting)
    return out


def _resolved(knobs: SettingLike) -> SettingLike:
    """``knobs`` as a Setting (full values: what a proposal holds), or as recorded where this version cannot read it."""
    try:
        return Setting.of(knobs)
    except KnobError:
        return knobs


def combo_key(setting: SettingLike) -> str:
    """A combination's identity (technique and knob order do not matter): what records and resumes match on."""
    setting = _resolved(setting)  # (a partial spelling and the full one are the same combination)
    return json.dumps({t: dict(sorted(v.items())) for t, v in sorted(setting.items())}, sort_keys=True, default=str)


class CombinationSearch:
    """Which combinations of the families' survivors to evaluate, told the results as they come.

    The candidates of a family are ``family_candidates`` (its survivors and, with ``merge``, merges of two of
    them). Every valid combination when there are at most ``max_exhaustive`` of them; otherwise an Optuna
    study over one candidate index per family (-1: none of that family), objective latency with the gate as a
    constraint, ``trials`` evaluations. Never the empty combination, never one already evaluated or being
    evaluated; a combination that conflicts is skipped before any work. The driver dispatches what
    ``propose`` returns and calls ``tell`` when it finishes; a resumed campaign first tells the recorded
    results again, so nothing finished is proposed twice.
    """

    def __init__(self, survivors: dict[str, list[dict[str, Any]]], gate: Any, *, seed: int = 0,
                 max_exhaustive: int = 64, trials: int = 16, limit: int = 200,
                 baseline_ms: float | None = None, merge: bool = False) -> None:
        self.gate = gate
        # each family's candidates (survivors, then merges): what the candidate indices of the study refer to
        self.candidates = {f: [{**c, "knobs": _resolved(c["knobs"])}
                               for c in family_candidates(front, merge=merge, baseline_ms=baseline_ms)]
                           for f, front in survivors.items()}
        self.families = sorted(survivors)
        self.results: dict[str, tuple[dict, dict]] = {}  # key -> (setting, result), in the order told
        self.pending: dict[str, Any] = {}  # key -> the Optuna trial (or None) of a proposal not yet told
        self.limit = limit
        self.baseline_ms = baseline_ms
        every = combinations(self.candidates)
        self.exhaustive = len(every) <= max_exhaustive
        self.total = len(every) if self.exhaustive else trials
        self._primed = False
        # the most promising first (``predicted_ms``), so that a campaign cut short has measured its best bets;
        # the combinations sharing a compiled configuration back to back (on one actor the second of them reuses
        # the graphs the first compiled): groups ordered by their best prediction, the uncompiled group first
        # on a tie
        self._queue = self._ordered(every) if self.exhaustive else []
        self._study = None
        if not self.exhaustive:
            import optuna

            self._study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed))

    def predicted_ms(self, setting: SettingLike) -> float:
        """A combination's latency if its parts' speed-ups multiplied (each survivor's latency over the
        baseline's, as measured in its family's trial): an order for the search, never a result. 0 without
        the baseline's latency (no order)."""
        if not self.baseline_ms:
            return 0.0
        predicted = self.baseline_ms
        for f, i in self._candidate_params(setting).items():
            if i >= 0:
                predicted *= self.candidates[f.rsplit(".", 1)[0]][i]["total_ms"] / self.baseline_ms
        return predicted

    def _ordered(self, settings: list[Setting]) -> list[Setting]:
        best: dict[str, float] = {}
        for c in settings:
            sig = compile_signature(c) or ""
            best[sig] = min(best.get(sig, math.inf), self.predicted_ms(c))
        return sorted(settings, key=lambda c: (best[compile_signature(c) or ""], compile_signature(c) or "",
                                               self.predicted_ms(c)))

    def seed_measured(self, setting: SettingLike, result: dict[str, Any]) -> None:
        """A combination measured already, outside this search (a single survivor is its family's trial, the
        same setting measured the same way against the same baseline): told as evaluated, so it is never run
        again; in a budgeted search it does not use up the budget."""
        if combo_key(setting) in self.results:
            return
        self.tell(setting, result)
        if not self.exhaustive:
            self.total += 1

    def _prime(self) -> None:
        """A budgeted search's first proposals: the combinations predicted fastest (half the budget, those
        not told already), queued before TPE samples; random start-up samples waste expensive evaluations."""
        self._primed = True
        if not self.baseline_ms:
            return
        every = [c for c in combinations(self.candidates) if combo_key(c) not in self.results]
        left = self.total - len(self.results)
        for c in sorted(every, key=self.predicted_ms)[:max(1, (left + 1) // 2)]:
            self._study.enqueue_trial(self._candidate_params(c))

    def _candidate_params(self, setting: SettingLike) -> dict[str, int]:
        """The candidate index per family a combination is made of (-1: none of it): the candidate of the
        family whose knobs the combination holds, the one with the most techniques where several do (a merge
        holds its parts' techniques; another family never sets this family's techniques)."""
        out = {}
        setting = _resolved(setting)
        for f in self.families:
            found = [i for i, s in enumerate(self.candidates[f])
                     if all(setting.get(t) == v for t, v in s["knobs"].items())]
            out[f"{f}.candidate"] = max(found, key=lambda i: len(self.candidates[f][i]["knobs"])) if found else -1
        return out

    def _sample(self) -> tuple[Any, Setting] | None:
        """One trial of the study and its combination; conflicting ones are told FAIL and sampled again."""
        import optuna

        from vidtune.search.campaign import set_constraints

        if not self._primed:
            self._prime()
        for _ in range(self.limit):
            trial = self._study.ask()
            parts = []
            for f in self.families:
                i = trial.suggest_int(f"{f}.candidate", -1, len(self.candidates[f]) - 1)
                parts.append(self.candidates[f][i]["knobs"] if i >= 0 else None)
            setting = _merge(tuple(parts))
            key = combo_key(setting) if setting else None
            if key in self.results:  # evaluated: the sampler learns the same value again, nothing runs
                self._tell_study(trial, self.results[key][1])
                continue
            if not setting or key in self.pending:
                set_constraints(trial, [1.0])
                self._study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                continue
            try:
                setting = Setting(setting)
                check_composition(setting)
            except (CompositionError, KnobError):
                self._study.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            return trial, setting
        return None

    def propose(self) -> Setting | None:
        """The next combination to evaluate, or None when the search has nothing more to give now."""
        if len(self.results) + len(self.pending) >= self.total:
            return None
        if self.exhaustive:
            while self._queue:
                setting = self._queue.pop(0)
                key = combo_key(setting)
                if key not in self.results and key not in self.pending:
                    self.pending[key] = None
                    return setting
            return None
        got = self._sample()
        if got is None:  # only repeats, empty or conflicting samples: the search space is spent
            self.total = len(self.results) + len(self.pending)
            return None
        trial, setting = got
        self.pending[combo_key(setting)] = trial
        return setting

    def withdraw(self, setting: Setting) -> None:
        """Take back a proposal that will not be evaluated in this run (too little run time left): it is no longer
        pending, and an exhaustive search proposes it first again."""
        trial = self.pending.pop(combo_key(setting), None)
        if self.exhaustive:
            self._queue.insert(0, setting)
        elif trial is not None:
            import optuna

            self._study.tell(trial, state=optuna.trial.TrialState.FAIL)  # (the run pauses; a resume proposes anew)

    def _tell_study(self, trial: Any, result: dict[str, Any]) -> None:
        import optuna

        from vidtune.search.campaign import set_constraints

        if result.get("status") == Status.OK:
            set_constraints(trial, self.gate.constraints(result["quality"]))
            self._study.tell(trial, result["total_ms"])
        else:
            self._study.tell(trial, state=optuna.trial.TrialState.FAIL)

    def tell(self, setting: SettingLike, result: dict[str, Any]) -> None:
        """A combination's result: proposed and just finished, or recorded by an earlier run (a resume)."""
        key = combo_key(setting)
        trial = self.pending.pop(key, None)
        if key in self.results:
            return
        self.results[key] = (setting, result)
        if self._study is None:
            return
        if trial is None:  # recorded before a resume: the same candidates, told to this study
            self._study.enqueue_trial(self._candidate_params(setting))
            trial = self._study.ask()
            for f in self.families:
                trial.suggest_int(f"{f}.candidate", -1, len(self.candidates[f]) - 1)
        self._tell_study(trial, result)

    def evaluated(self) -> list[dict[str, Any]]:
        """Every told combination with its outcome (``passes_gate``: ok and within the gate)."""
        out = []
        for setting, res in self.results.values():
            ok = res.get("status") == Status.OK and self.gate.passes(res["quality"])
            paired = res.get("paired") or {}
            out.append({"knobs": setting, "status": res.get("status"), "passes_gate": ok,
                        # measured paired: its interval below 1; measured alone: nothing to say
                        "faster": bool(paired.get("faster", True)) if ok else False,
                        "ratio": paired.get("ratio"), "interval": paired.get("interval"),
                        "total_ms": res.get("total_ms"), "quality": res.get("quality"),
                        "reason": res.get("reason"), "message": res.get("message"),
                        "reused_from": res.get("reused_from")})
        return out


def ranked(evaluated: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The combinations that pass the gate and are faster than the baseline beyond the noise, fastest first."""
    return sorted((e for e in evaluated if e["passes_gate"] and e.get("faster", True)), key=lambda e: e["total_ms"])


def choose(evaluated: list[dict[str, Any]]) -> Setting:
    """The fastest of ``ranked`` ({} when none is: the baseline)."""
    passing = ranked(evaluated)
    return Setting.of(passing[0]["knobs"] if passing else {})


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
    with the reason. A final bench that failed (``status`` fail: it ran out of memory) loses the same way."""
    if not chosen:
        return chosen, final, None
    if final.get("status") == Status.FAIL:
        why = f"its final bench failed ({final.get('reason')}: {final.get('message')})"
        log(f"integrator: the fastest gated combination: {why}; the tuned config is the baseline (no techniques)")
        return {}, bench({}), {"knobs": chosen, "reason": why}
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
