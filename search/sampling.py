"""How a campaign samples: a family's setting define-by-run, the search space's checks, the TPE sampler, no-op and
duplicate samples skipped, and the settings queued first (warm start, seed configs)."""

from __future__ import annotations

import hashlib
import json
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from vidtune.search.errors import SearchSpaceError
from vidtune.search.records import Reason
from vidtune.search.spec import CampaignSpec, load_spec
from vidtune.search.storage import storage_for

if TYPE_CHECKING:
    from vidtune.techniques.setting import KnobValues, SettingLike

__all__ = ["searched", "clashes", "sample_family_setting", "family_distributions", "check_search_space", "search_plan", "family_sampler",
           "ask_effective", "warm_start_params", "seed_params", "set_constraints"]


def searched(family: str) -> list[Any]:
    """The family's techniques a search samples, in the registry's order (test techniques, ``<family>.test_*``,
    are left to their tests)."""
    from vidtune.techniques import registered

    return [t for t in registered(family) if not t.name.split(".")[1].startswith("test_")]


def clashes(tech: Any, chosen: Any) -> bool:
    """Whether ``tech`` cannot go with those ``chosen``: seams overlapping one of theirs with no composition rule."""
    from vidtune.techniques.setting import composition_rule, overlapping_seams

    return any(overlapping_seams(tech, c) and composition_rule(tech, c) is None for c in chosen)


def sample_family_setting(trial: Any, family: str, request: Any = None) -> KnobValues:
    """Define-by-run sample of one family: per technique a ``use`` flag, then its knobs when used.

    A technique whose seams overlap those of one chosen earlier in the same trial, with no composition rule
    between the two, is not offered (e.g. TeaCache after the first-block cache; the STG prefix after either
    is, by its rule), so trials are not wasted on settings ``compose`` would reject; nor is one that says it
    does not apply to the request (``Technique.applicable``).
    A sampled setting that is off, or cannot change anything for the request (``Technique.effective``),
    is left out; an empty result is a no-op the caller skips instead of measuring the baseline again.
    """
    from vidtune.techniques.registry import KnobError

    setting: KnobValues = {}
    chosen: list[Any] = []
    for tech in searched(family):
        if clashes(tech, chosen) or not tech.applicable(request):
            continue
        if trial.suggest_categorical(f"{tech.name}.use", [False, True]):
            values = tech.suggest(trial, request)
            try:
                full = tech.validate(values)
            except KnobError:  # invalid for a cross-knob reason: kept, so the caller records why it failed
                full = None
            if full is not None and (tech.is_off(full) or (request is not None and not tech.effective(full, request))):
                continue
            setting[tech.name] = values
            chosen.append(tech)
    return setting


def family_distributions(family: str, request: Any) -> dict[str, Any]:
    """Every Optuna distribution a family's sampling can use here (each technique sampled alone, so that
    seam claims hide none), by parameter name."""
    import optuna

    from vidtune.techniques import registered
    from vidtune.techniques.registry import KnobError

    found: dict[str, Any] = {}
    names = [t.name for t in registered(family)]
    for name in names:
        probe = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        probe.enqueue_trial({f"{n}.use": n == name for n in names})
        trial = probe.ask()
        try:
            sample_family_setting(trial, family, request)
        except KnobError:  # a technique that cannot be offered here has no distributions to compare
            continue
        found.update(trial.distributions)
    return found


def check_search_space(study: Any, family: str, request: Any) -> None:
    """Raise ``SearchSpaceError`` when a resumed study holds a categorical parameter whose choices this
    version samples differently (Optuna refuses a categorical's choices to change inside a study; e.g.
    a technique's switch no longer offers its off value). Numeric ranges may change: Optuna allows it."""
    from optuna.distributions import check_distribution_compatibility

    now = family_distributions(family, request)
    for trial in study.get_trials(deepcopy=False):
        for param, old in trial.distributions.items():
            if param not in now:
                continue
            try:  # raises for a changed categorical's choices or another kind of distribution
                check_distribution_compatibility(old, now[param])
            except ValueError:
                raise SearchSpaceError(
                    f"campaign study {study.study_name!r} was sampled with {param} in {_domain(old)}; this vidtune "
                    f"samples it in {_domain(now[param])}, and an Optuna study cannot change that. Start a new "
                    f"campaign (another name=) or delete its folder to search again from scratch") from None


def _domain(d: Any) -> str:
    return f"{list(d.choices)}" if hasattr(d, "choices") else f"[{d.low}, {d.high}]"


@contextmanager
def search_plan(spec: CampaignSpec) -> Iterator[None]:
    """While a campaign samples: the actors' world (parallelism degrees are sampled and checked against it)
    and their stage-2 tiling (tile_parallel settings with one tile to share are skipped as no-ops). Both
    plans are process-wide; the earlier ones come back afterwards."""
    from vidtune.model.tiles import Stage2Tiling
    from vidtune.techniques.parallelism.distributed import planned_world
    from vidtune.techniques.parallelism.tile_parallel import planned_stage2_tiling

    with planned_world(spec.ranks_per_actor), \
            planned_stage2_tiling(Stage2Tiling(**spec.worker.stage2_tiling)):
        yield


def family_sampler(seed: int, family: str, trials_so_far: int) -> Any:
    """The family's TPE sampler, seeded by the campaign's seed, the family and how many trials its study
    already holds. A sampler seeded by the campaign's seed alone starts its random stream over at every
    resume and proposes the first trials' parameters again (the committed one-GPU campaign's kernel_choice
    trial 4 repeated trial 0's); TPE's guided trials read the study's history, so only the stream moves.

    Multivariate and grouped: a family's space is conditional (a technique's knobs exist only where it is
    used), and TPE's independent per-parameter densities there mostly re-draw the start-up's mix. On the
    search-efficiency table of tiny caching (34 settings, 40 seeded replays, ``benchmarks/search_efficiency.py
    score --strategies tpe``; 2026-12-05) the independent TPE reached within 5% of the best in a median of 52
    evaluations (29 of 40 runs), the grouped multivariate one in 42 (31 of 40); the probes before it (search/probes.py)
    bring that to 4."""
    import warnings

    import optuna

    mix = int.from_bytes(hashlib.sha256(f"{seed}:{family}:{trials_so_far}".encode()).digest()[:4], "big")
    with warnings.catch_warnings():  # (multivariate and group are "experimental" in Optuna 4)
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=mix, n_startup_trials=4, multivariate=True, group=True)


def _param_key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def ask_effective(study: Any, family: str, request: Any, limit: int = 50,
                  reject: Any = None, on_ask: Any = None) -> tuple[Any, KnobValues | None, int]:
    """Ask ``study`` until the sampled setting changes something and is new; returns (trial, setting, skipped).

    A no-op sample (every technique left unused, off, or without effect on the request) is told PRUNED
    with reason ``no-op``, and a sample whose parameters an earlier trial of the study already measured, or
    is measuring, with reason ``duplicate`` (its result would only repeat that trial's): neither costs a
    measurement or counts against the budget. Re-queued trials (an interrupted trial's parameters) are
    asked as queued. ``reject(setting)`` may give a reason not to measure a setting (a known loser on this GPU
    class): such a sample is pruned with reason ``known-loser`` and the reason in ``why``. After ``limit`` such
    samples in a row the family is taken as exhausted: (None, None, limit). ``on_ask(trial)`` runs right after
    each ask, before the sampling (the driver leases the trial there: a campaign starting meanwhile on the same
    storage FAILed a RUNNING trial without a lease as interrupted, and the sampling of it then raised
    UpdateFinishedTrialError in the fresh-clone CI's two-process PostgreSQL test).
    """
    import optuna

    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.RUNNING)
    for skipped in range(limit):
        trial = study.ask()
        if on_ask is not None:
            on_ask(trial)
        setting = sample_family_setting(trial, family, request)
        if setting:
            key = _param_key(trial.params)
            seen = [t.number for t in study.get_trials(deepcopy=False, states=states)
                    if t.number != trial.number and t.user_attrs.get("reason") != Reason.INTERRUPTED and t.params
                    and _param_key(t.params) == key]
            why = reject(setting) if reject is not None and not seen else None
            if not seen and why is None:
                return trial, setting, skipped
            if seen:
                trial.set_user_attr("reason", Reason.DUPLICATE)
                trial.set_user_attr("duplicate_of", seen[0])
            else:
                trial.set_user_attr("reason", Reason.KNOWN_LOSER)
                trial.set_user_attr("why", why)
        else:
            trial.set_user_attr("reason", Reason.NO_OP)
        set_constraints(trial, [1.0, 1.0, 1.0])  # counts as infeasible for the sampler (it gives nothing new)
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    return None, None, limit


def warm_start_params(spec: CampaignSpec, family: str, best: int = 2) -> list[tuple[str, dict[str, Any]]]:
    """The parameters of the ``best`` fastest feasible trials of ``family`` in each earlier campaign of
    ``spec.warm_start`` (faster than its baseline beyond the noise where measured paired), as (origin,
    params): a new study of the same model and device on another request starts from them (the driver
    enqueues them), so that its first trials are the earlier campaign's findings instead of random ones."""
    import optuna

    out = []
    for other in spec.warm_start:
        earlier = load_spec(Path(spec.results_dir) / other)
        try:
            study = optuna.load_study(study_name=f"{earlier.name}:{family}", storage=storage_for(earlier))
        except KeyError:  # that campaign did not search this family
            continue
        done = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
                if t.user_attrs.get("feasible") and (t.user_attrs.get("paired") or {}).get("faster", True) and t.params]
        for t in sorted(done, key=lambda t: t.values[0])[:best]:
            out.append((f"{earlier.name}:{family}#{t.number}", dict(t.params)))
    return out


def seed_params(family: str, knobs: SettingLike, request: Any) -> tuple[dict[str, Any] | None, str]:
    """The Optuna parameters of ``family``'s sampling that give exactly the family's part of ``knobs`` (a
    seed config's setting), and what that part is; ``(None, why)`` when the family's search space cannot
    express it (a value outside what its ``suggest`` offers here, a knob it does not sample, a technique
    not offered for the request) or ``knobs`` has no part in the family (why: "").

    Found by running the family's sampling on a probe study with the candidate parameters queued: every
    parameter the sampling asked must have been given and lie in the distribution it was asked with, and
    the setting it built must equal the seed's part (both with their knobs' defaults filled in)."""
    import warnings

    import optuna

    from vidtune.techniques import registered
    from vidtune.techniques.registry import KnobError, get
    from vidtune.techniques.setting import resolve_values

    part = {n: get(n).canonical(v, request) for n, v in resolve_values(knobs).items() if get(n).family == family}
    if not part:
        return None, ""
    names = [t.name for t in registered(family)]
    given: dict[str, Any] = {f"{n}.use": n in part for n in names}
    for name, values in part.items():
        given.update({f"{name}.{k}": v for k, v in values.items()})
    probe = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a fixed value outside its distribution is checked below)
        probe.enqueue_trial(given)
        trial = probe.ask()
        try:
            built = resolve_values(sample_family_setting(trial, family, request))
        except (KnobError, ValueError) as exc:
            return None, f"its {family} knobs {part} cannot be sampled here ({exc}: a technique or value the family does not offer on this device or request)"
    asked = trial.params
    not_given = sorted(set(asked) - set(given))
    outside = sorted(p for p in asked if p in given and not _contains(trial.distributions[p], asked[p]))
    if not_given or outside or built != part:
        why = (f"the family samples {not_given}, which the seed does not set" if not_given else
               f"{outside} lie outside what the family samples for this request" if outside else
               f"the family's sampling builds {built} from it (a technique not offered here, one that changes nothing "
               f"for this request, or a knob the family fixes)")
        return None, f"its {family} knobs {part} are not in the family's search space: {why}"
    return dict(asked), f"{part}"


def _contains(distribution: Any, value: Any) -> bool:
    try:
        return bool(distribution._contains(distribution.to_internal_repr(value)))
    except ValueError:  # a categorical's value not among its choices
        return False


def set_constraints(trial: Any, values: list[float]) -> None:
    """The quality gate's constraints on an Optuna trial (feasible where all are <= 0), keyed "0", "1", ...:
    the keys Optuna gives a list stored by the ``constraints_func`` of earlier campaigns (deprecated in
    Optuna 5), so a journal that holds both kinds reads the same."""
    for i, value in enumerate(values):
        trial.set_constraint(str(i), value)
