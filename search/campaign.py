"""A campaign's trials: telling a study a result and recording it, and the agents' ask/tell (leases).

The driver that runs a campaign (``vidtune.driver.Campaign``, above search/ and the integrator) owns the
studies through these functions and those of ``spec``, ``storage`` and ``sampling``: it samples a setting per
family (``ask_effective``), sends it to a free actor, and tells the study the result: objectives latency (total
ms, minimise) and PSNR (maximise), the quality gate as constraints (<= 0 is feasible). A killed campaign resumes
from its storage: finished trials are kept, interrupted ones re-queued with their parameters, nothing measured is
proposed again. (The names of those modules are re-exported here.)
"""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Any

from vidtune.search.errors import (CampaignBusy, CampaignPaused, CampaignStopped, SearchSpaceError,  # noqa: F401
                                   StorageError)
from vidtune.search.probes import queue_follow_ups
from vidtune.search.records import Reason, Status
from vidtune.search.sampling import (ask_effective, check_search_space, family_distributions,  # noqa: F401
                                     family_sampler, sample_family_setting, search_plan, seed_params, set_constraints,
                                     warm_start_params)
from vidtune.search.spec import (AnyTier, CampaignSpec, Gate, check_resumed_quality, load_spec,  # noqa: F401
                                 save_spec, spec_summary)
from vidtune.search.storage import (StopOnSignals, campaign_lock, check_stop, rdb_storage,  # noqa: F401
                                    repair_journal, storage_for)

__all__ = ["ask_trial", "tell_trial", "tell_result", "append_record", "check_told_result", "live_lease", "when",
           "overhead_summary", "MAX_LEASE_S",
           # re-exported from spec, storage, sampling and errors
           "Gate", "AnyTier", "CampaignSpec", "spec_summary", "save_spec", "load_spec", "check_resumed_quality",
           "repair_journal", "check_stop", "StopOnSignals", "campaign_lock", "storage_for", "rdb_storage",
           "sample_family_setting", "family_distributions", "check_search_space", "search_plan", "family_sampler",
           "ask_effective", "warm_start_params", "seed_params", "set_constraints",
           "StorageError", "SearchSpaceError", "CampaignBusy", "CampaignStopped", "CampaignPaused"]

MAX_LEASE_S = 30 * 86400.0  # an agent's lease (vidtune ask --lease-s): at most 30 days


def overhead_summary(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The campaign's per-trial framework overhead, over the measured trials and combinations: the share
    of each evaluation's wall time outside its generations (applying and undoing the setting, the quality
    metrics, what runs between stages), its median and worst, and the warm-up generations' share beside
    it (a compile lands there). None when no record carries its timing."""
    import statistics

    timed = [r["timing"] for r in records if r.get("status") == Status.OK and (r.get("timing") or {}).get("wall_s")]
    if not timed:
        return None
    fractions = [t["framework_fraction"] for t in timed]
    warm = [t["warmup_runs_s"] / t["wall_s"] for t in timed]
    return {"evaluations": len(timed), "framework_fraction_median": round(statistics.median(fractions), 4),
            "framework_fraction_max": round(max(fractions), 4),
            "warmup_fraction_median": round(statistics.median(warm), 4),
            "quality_s_median": round(statistics.median(t["quality_s"] for t in timed), 3),
            "what": "share of each evaluation's wall time outside its generations (apply/undo, metrics, between "
                    "stages); the warm-up generations' share beside it"}


def append_record(spec: CampaignSpec, record: dict[str, Any]) -> None:
    """One finished trial or combination appended to the campaign's ``trials.jsonl`` as it finishes (what the
    report and a resume read)."""
    from vidtune.search.records import RecordLog

    message = RecordLog(spec.directory / "trials.jsonl").append(record)
    if message:
        print(message, file=sys.stderr)


def tell_result(spec: CampaignSpec, study: Any, trial: Any, family: str, result: dict[str, Any]) -> None:
    """Tell ``study`` a trial's result (objectives, the gate's constraints, or FAIL with its reason) and
    record it in ``trials.jsonl``: for the driver's trials and an agent's ``tell`` alike.

    When the trial was finished meanwhile by someone else (an outside ``tell`` on a lease that had expired),
    this measurement is not lost and the caller does not crash: it is added as a new trial with the same
    parameters (``measured_for``: the number it was measured for)."""
    number = trial.number
    base = {"family": family, "trial": number, "params": trial.params, "time": time.time()}
    attrs = getattr(trial, "user_attrs", None) or {}
    origin = attrs.get("seeded_from") or attrs.get("warm_start_from")
    if origin:  # queued by seed_configs or warm_start: the report says where the setting came from
        base["queued_from"] = ("seed " if attrs.get("seeded_from") else "warm start ") + str(origin)
    if result.get("status") == Status.OK:
        q = result["quality"]
        constraints = spec.search_gate.constraints(q)
        user = {key: result[key] for key in ("latency", "quality", "stats", "knobs", "start_stage", "total_ms",
                                             "timing", "paired", "screened") if key in result}  # (a told result: total_ms, quality)
        user.update(constraints=constraints, feasible=all(c <= 0 for c in constraints))
        # flat copies for a reader of the study (optuna-dashboard shows user attributes one per row)
        user.update(psnr_db=q.get("psnr_db"), **({"ratio": result["paired"]["ratio"], "interval": result["paired"]["interval"]}
                                                 if result.get("paired") else {}),
                    **({"tiers": [n for n, g in spec.tiers if g.passes(q)]} if spec.tiers else {}),
                    **({"peak_memory_gb": round(result["peak_memory_bytes"] / 2**30, 3)} if result.get("peak_memory_bytes") else {}))
        told = _tell(study, trial, user, values=[result["total_ms"], q["psnr_db"]], constraints=constraints)
        record = {**base, **{k: v for k, v in result.items() if k != "traceback"}, "constraints": constraints}
    else:
        user = {"reason": result.get("reason", Reason.ERROR), "message": result.get("message", ""),
                "knobs": result.get("knobs", {})}
        told = _tell(study, trial, user, values=None, constraints=None)
        record = {**base, **{k: v for k, v in result.items() if k != "traceback"}}
    if told != number:
        record.update(trial=told, measured_for=number)
    append_record(spec, record)


def _tell(study: Any, trial: Any, user_attrs: dict[str, Any], values: list[float] | None,
          constraints: list[float] | None) -> int:
    """Finish ``trial`` (COMPLETE with ``values``, or FAIL); returns the number the result was stored under:
    the trial's own, or a new trial's when someone else finished this one meanwhile."""
    import optuna

    from vidtune._io import strict_json

    user_attrs = json.loads(strict_json(user_attrs))  # standard JSON in the journal (NaN -> null)
    state = optuna.trial.TrialState.COMPLETE if values is not None else optuna.trial.TrialState.FAIL
    if not study.get_trials(deepcopy=False)[trial.number].state.is_finished():
        try:
            for key, value in user_attrs.items():
                trial.set_user_attr(key, value)
            if constraints is not None:
                set_constraints(trial, constraints)
            study.tell(trial, values, state=None if values is not None else state)
            return trial.number
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # finished by another process between the check and the tell
    frozen = study.get_trials(deepcopy=False)[trial.number]
    study.add_trial(optuna.trial.create_trial(
        state=state, values=values, params=frozen.params, distributions=frozen.distributions,
        user_attrs={**user_attrs, "measured_for": trial.number},
        constraints=None if constraints is None else {str(i): c for i, c in enumerate(constraints)}))
    return max(t.number for t in study.get_trials(deepcopy=False) if t.user_attrs.get("measured_for") == trial.number)


def _study(spec: CampaignSpec, family: str, storage: Any = None) -> Any:
    import optuna

    if family not in spec.families:
        raise ValueError(f"--family must be one of the campaign's families {list(spec.families)}, got {family!r}")
    return optuna.load_study(study_name=f"{spec.name}:{family}", storage=storage or storage_for(spec))


def ask_trial(spec: CampaignSpec, family: str, lease_s: float = 3600.0) -> dict[str, Any]:
    """Ask the family's study for the next setting (the trial stays RUNNING until told). The trial is leased
    for ``lease_s`` seconds: a campaign resumed meanwhile leaves it to the agent (``lease_until``)."""
    if not (isinstance(lease_s, (int, float)) and math.isfinite(lease_s) and 0 < lease_s <= MAX_LEASE_S):
        raise ValueError(f"--lease-s must be a number of seconds in (0, {MAX_LEASE_S:.0f}], got {lease_s!r}")
    study = _study(spec, family)
    req = spec.worker.request
    with search_plan(spec):  # the same choices as the campaign's own trials
        if spec.probes:  # (the probes' next step, as the driver takes it)
            queue_follow_ups(study, family, req)
        lease_until = time.time() + lease_s  # (leased as asked: a driver starting meanwhile leaves it alone)
        trial, setting, _ = ask_effective(study, family, req, on_ask=lambda t: t.set_user_attr("lease_until", lease_until))
    if trial is None:
        raise ValueError(f"family {family!r}: the sampler proposes only settings that change nothing for this request")
    trial.set_user_attr("asked_by", "agent")
    return {"campaign": spec.name, "family": family, "trial": trial.number, "knobs": setting,
            "lease_until": when(lease_until)}


def live_lease(user_attrs: dict[str, Any], now: float | None = None) -> float | None:
    """A running trial's lease end (``lease_until``) when it is live, else None. A lease further away than
    ``MAX_LEASE_S`` (or not a finite number) is one no vidtune writes now (an older ``ask --lease-s inf`` wrote
    1e300, and every resume then failed formatting it): it counts as expired, so the trial is taken over."""
    lease = user_attrs.get("lease_until")
    now = time.time() if now is None else now
    if isinstance(lease, bool) or not isinstance(lease, (int, float)) or not math.isfinite(lease):
        return None
    return float(lease) if now < lease <= now + MAX_LEASE_S + 3600 else None


def when(timestamp: float) -> str:
    """A local date and time for messages."""
    return time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(timestamp))


def check_told_result(result: Any) -> None:
    """Refuse a told result before anything is recorded (ValueError naming the field): ``tell`` with
    ``total_ms: NaN`` left trials.jsonl saying ok while the study said FAIL, and strings crashed with the
    trial left RUNNING."""
    import math

    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    if not isinstance(result, dict):
        raise ValueError(f"--result must hold a JSON object, got {type(result).__name__}")
    status = result.get("status")
    if status not in (Status.OK, Status.FAIL):
        raise ValueError(f"--result: field status must be one of ['ok', 'fail'], got {status!r}")
    if "knobs" in result and not isinstance(result["knobs"], dict):
        raise ValueError(f"--result: field knobs must be an object of technique -> knob values, got {result['knobs']!r}")
    if status == Status.FAIL:
        if not isinstance(result.get("reason", ""), str):
            raise ValueError(f"--result: field reason must be a string, got {result['reason']!r}")
        return
    if not number(result.get("total_ms")) or result["total_ms"] <= 0:
        raise ValueError(f"--result: an ok result needs field total_ms, a finite number of milliseconds > 0, got "
                         f"{result.get('total_ms')!r}")
    quality = result.get("quality")
    if not isinstance(quality, dict):
        raise ValueError(f"--result: an ok result needs field quality, an object, got {quality!r}")
    for key in ("psnr_db", "ssim", "audio_snr_db"):
        if not number(quality.get(key)):
            raise ValueError(f"--result: field quality.{key} must be a finite number, got {quality.get(key)!r}")
    for key, value in quality.items():  # optional metrics: a finite number or null (the records stay standard JSON)
        if value is not None and not number(value):
            raise ValueError(f"--result: field quality.{key} must be a finite number or null, got {value!r}")


def tell_trial(spec: CampaignSpec, number: int, result: dict[str, Any], family: str | None = None) -> dict[str, Any]:
    """Record an externally measured result (``status`` ok with ``total_ms`` and ``quality``, or fail)."""
    import optuna

    families = [family] if family else list(spec.families)
    matches = []
    storage = storage_for(spec)
    for f in families:
        study = _study(spec, f, storage)
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            if t.number == number:
                matches.append((f, study, t))
    if len(matches) != 1:
        raise ValueError(f"--trial {number}: {len(matches)} running trials with that number in {families}; "
                         f"give --family to choose" if matches else f"--trial {number}: no running trial with that number")
    f, study, frozen = matches[0]
    check_told_result(result)
    lease, owner = live_lease(frozen.user_attrs), frozen.user_attrs.get("lease_owner")
    if owner and lease is not None:
        # a driver is measuring it (its lease renewed every 30 s): its own result would be lost, or worse
        raise ValueError(f"--trial {number}: the campaign's driver {owner} (pid {frozen.user_attrs.get('lease_pid')}) is "
                         f"measuring it, leased until {when(lease)}; "
                         f"tell only a trial you asked (vidtune ask)")
    # (the trial another process asked, through the storage's public API: a Study tells only its own asks)
    trial = optuna.trial.Trial(study, storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name(study.study_name), number))
    tell_result(spec, study, trial, f, {"knobs": result.get("knobs", {}), **result})
    return {"family": f, "trial": number, "state": study.trials[number].state.name}
