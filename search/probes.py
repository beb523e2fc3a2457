"""A family study's first probes, as a performance engineer would turn a technique up until it breaks: each
technique alone with its knobs at their fast end (``Knob.fast``); one that fails the quality gate, again at
halfway; then the techniques that passed, combined fastest first where their seams allow.

The probes are queued trials of the family's own sampling (their parameters fix the technique's switch, its
directional knobs and, drawn once, the rest), told and learnt from like any trial, so TPE starts from them
instead of from random draws. Which probes were queued is kept in the study (the ``probe`` user attribute), so
a resumed campaign queues the next ones where the killed one stopped.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from vidtune.search.records import Reason
from vidtune.search.sampling import clashes, sample_family_setting, searched, seed_params

if TYPE_CHECKING:
    from vidtune.techniques.setting import KnobValues

__all__ = ["PROBE", "HALF", "COMBINED", "probe_params", "queue_probes", "queue_follow_ups"]

PROBE = "probe"  # the trials' user attribute naming a probe: the technique's name, ``<name>@half`` or COMBINED
HALF = "@half"
COMBINED = "combined"  # also the study's user attribute once the probes were combined: the techniques combined


class _ProbeTrial:
    """Stands in for an Optuna trial while a probe's parameters are worked out: the technique ``use``d alone, its
    directional knobs at ``level`` (1: the fast end, 0.5: halfway from the other end), every other parameter
    from ``draw`` (a throwaway trial). ``params`` collects them all: a probe fixes every parameter, so that what
    is measured is the setting checked here (one the request feels)."""

    def __init__(self, draw: Any, use: str, level: float, backed_off: str | None = None) -> None:
        from vidtune.techniques import get

        self.draw, self.use = draw, use
        self.knobs = {f"{use}.{k.name}": k for k in get(use).knobs if k.fast is not None}
        # the level of each directional knob: ``backed_off`` alone at ``level`` (the others at their fast end), or all
        self.levels = {n: (level if backed_off in (None, k.name) else 1.0) for n, k in self.knobs.items()}
        self.params: dict[str, Any] = {}

    def _fix(self, name: str, value: Any) -> Any:
        self.params[name] = value
        return value

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        choices = list(choices)
        if name.endswith(".use"):
            return self._fix(name, name[:-len(".use")] == self.use)
        knob = self.knobs.get(name)
        if knob is None or knob.fast not in choices:
            return self._fix(name, self.draw.suggest_categorical(name, choices))
        ordered = [c for c in choices if c != knob.off]
        if not all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in ordered):
            ordered = [knob.fast]  # (names, or a switch: no order to back off along)
        fast = ordered.index(knob.fast)
        far = 0 if fast >= len(ordered) / 2 else len(ordered) - 1  # the other end of the list
        return self._fix(name, ordered[int(round(far + (fast - far) * self.levels[name]))])

    def suggest_int(self, name: str, low: int, high: int, step: int = 1, log: bool = False) -> int:
        knob = self.knobs.get(name)
        if knob is None:
            return self._fix(name, self.draw.suggest_int(name, low, high, step=step, log=log))
        value = _between(low, high, knob.fast, self.levels[name], log)
        return self._fix(name, min(high, low + step * int(round((value - low) / step))))

    def suggest_float(self, name: str, low: float, high: float, log: bool = False, **_: Any) -> float:
        knob = self.knobs.get(name)
        if knob is None:
            return self._fix(name, self.draw.suggest_float(name, low, high, log=log))
        return self._fix(name, float(_between(low, high, knob.fast, self.levels[name], log)))


def _between(low: float, high: float, fast: str, level: float, log: bool) -> float:
    """The point ``level`` of the way from the slow end of [low, high] to the ``fast`` end (geometric on a log scale)."""
    a, b = (low, high) if fast == "high" else (high, low)
    if log and low > 0:
        return math.exp(math.log(a) + (math.log(b) - math.log(a)) * level)
    return a + (b - a) * level


def probe_params(family: str, technique: str, request: Any, level: float = 1.0, draws: int = 16) -> dict[str, Any] | None:
    """The parameters of a probe of ``technique`` at ``level``: its switch on and the other techniques off, its
    directional knobs at ``level``, the rest drawn (seeded; redrawn up to ``draws`` times until the request
    feels the setting: a stage of too few steps for the kept ones, say). None when the technique has no
    directional knob, is not offered for the request, or no draw gives a setting that changes something."""
    import optuna

    from vidtune.techniques import get

    tech = get(technique)
    if not any(k.fast is not None for k in tech.knobs):
        return None
    # backed off: every directional knob; where that leaves nothing the request feels (the kept steps of a
    # short stage), the technique's switch alone (a cache's threshold, the skip interval, Sol's beta)
    switch = tech.knob(tech.switch) if tech.switch is not None else None
    for backed_off in ([None] if level == 1.0 or switch is None or switch.fast is None else [None, tech.switch]):
        for seed in range(draws):
            draw = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed)).ask()
            trial = _ProbeTrial(draw, technique, level, backed_off)
            if technique in sample_family_setting(trial, family, request):
                return trial.params
    return None


def _probes(study: Any) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for t in study.get_trials(deepcopy=False):
        label = t.user_attrs.get(PROBE)
        if label and t.user_attrs.get("reason") != Reason.INTERRUPTED:  # (queued again under the same label)
            out.setdefault(label, []).append(t)
    return out


def queue_probes(study: Any, family: str, request: Any, say: Any = None) -> list[str]:
    """Queue one probe per technique of ``family`` with directional knobs, at their fast end, in the registry's
    order; returns the techniques probed."""
    queued = []
    for tech in searched(family):
        params = probe_params(family, tech.name, request)
        if params is None:
            continue
        study.enqueue_trial(params, user_attrs={PROBE: tech.name}, skip_if_exists=False)
        queued.append(tech.name)
        if say is not None:
            say(f"[{family}] probe queued: {tech.name} at the fast end of its knobs")
    return queued


def queue_follow_ups(study: Any, family: str, request: Any, say: Any = None) -> list[str]:
    """Once the probes queued so far are all measured: a probe that failed the quality gate is queued again at
    halfway (once), and when none is left to measure, the techniques whose probes passed, combined (fastest
    first; one whose seams clash with a faster one's, without a composition rule, is left out). Returns the
    labels queued (none while a probe is still waiting or running)."""
    from optuna.trial import FixedTrial, TrialState

    from vidtune.techniques import get

    probes = _probes(study)
    if not probes or COMBINED in study.user_attrs:
        return []
    trials = [t for ts in probes.values() for t in ts]
    if any(t.state in (TrialState.WAITING, TrialState.RUNNING) for t in trials):
        return []

    def passed(t: Any) -> bool:
        return (t.state == TrialState.COMPLETE and bool(t.user_attrs.get("feasible"))
                and (t.user_attrs.get("paired") or {}).get("faster", True))

    queued = []
    for label, ts in probes.items():
        if HALF in label or f"{label}{HALF}" in probes or any(passed(t) for t in ts):
            continue
        if not any(t.state in (TrialState.COMPLETE, TrialState.FAIL) for t in ts):
            continue  # (pruned: a duplicate or known loser; nothing learnt)
        params = probe_params(family, label, request, level=0.5)
        if params is not None and params != ts[0].params:
            study.enqueue_trial(params, user_attrs={PROBE: f"{label}{HALF}"}, skip_if_exists=False)
            queued.append(f"{label}{HALF}")
            if say is not None:
                say(f"[{family}] probe {label} failed the quality gate: queued again halfway to its slow end")
    if queued:
        return queued
    best: dict[str, tuple[float, dict[str, Any]]] = {}  # technique -> (latency, its values) of its fastest pass
    for label, ts in probes.items():
        name = label.split("@")[0]
        for t in ts:
            if passed(t) and (name not in best or t.values[0] < best[name][0]):
                setting = sample_family_setting(FixedTrial(t.params), family, request)
                if name in setting:
                    best[name] = (t.values[0], setting[name])
    chosen: KnobValues = {}
    for name, (_, values) in sorted(best.items(), key=lambda kv: kv[1][0]):
        if clashes(get(name), [get(c) for c in chosen]):
            continue
        chosen[name] = values
    params, _ = seed_params(family, chosen, request) if len(chosen) > 1 else (None, "")
    study.set_user_attr(COMBINED, sorted(chosen))  # the probes are looked at once, combined or not
    if params is None:
        return []
    study.enqueue_trial(params, user_attrs={PROBE: COMBINED}, skip_if_exists=False)
    if say is not None:
        say(f"[{family}] probes that passed, combined: {' + '.join(chosen)} queued")
    return [COMBINED]
