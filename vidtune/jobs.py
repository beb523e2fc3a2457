"""The jobs the driver's dispatch loop runs: the families' trials (sampled, checked and leased) and the
integrator's combinations, each recorded as it finishes."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from vidtune.integrator.combine import CombinationSearch, combo_key
from vidtune.search.campaign import ask_effective, live_lease
from vidtune.search.halving import front_points
from vidtune.search.probes import PROBE, queue_follow_ups
from vidtune.search.quality_model import quality_setting
from vidtune.search.records import Reason, Status
from vidtune.techniques.registry import KnobError
from vidtune.techniques.setting import CompositionError, compile_signature

if TYPE_CHECKING:
    from vidtune.techniques.setting import Setting
    from vidtune.driver import Campaign

__all__ = ["Job", "FamilyTrials", "Combinations", "queued_origin", "skipped_reasons", "HEARTBEAT_S", "LEASE_S"]

# A running trial is leased to the driver measuring it (``lease_until``, ``lease_owner``), renewed every
# HEARTBEAT_S while it runs: a campaign started meanwhile elsewhere on the same storage (another host, or an
# agent's `vidtune ask`) leaves a live lease alone, and takes over an expired one (its driver died).
# Optuna's own heartbeat runs only inside study.optimize, which the driver does not use (ask/tell).
HEARTBEAT_S = 30.0
LEASE_S = 120.0


@dataclass
class Job:
    """One evaluation to dispatch: a family's trial or a combination; ``done`` takes its result."""

    setting: Setting
    done: Callable[[dict[str, Any]], None]
    scoped: bool = True
    renew: Callable[[], None] | None = None  # the heartbeat: extend the job's lease
    screen: Any = None  # the gate a setting's quality is screened against before it is timed (``TrialWorker.evaluate``)
    front: list[tuple[float, float]] | None = None  # its family's survivors, to prune against (search/halving.py)


def skipped_reasons(study: Any, skipped: int) -> str:
    """Why the last ``skipped`` samples of ``study`` were not measured (``ask_effective`` pruned them), counted by
    reason, with the first known loser's reason in words (an earlier campaign's loser, an out-of-memory setting,
    a catalogue rule): a person reading the log sees what the search declined and why."""
    import optuna

    pruned = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.PRUNED,))[-skipped:]
    counts: dict[str, int] = {}
    for t in pruned:
        reason = str(t.user_attrs.get("reason") or "pruned")
        counts[reason] = counts.get(reason, 0) + 1
    words = {Reason.NO_OP: "changed nothing for this request", Reason.DUPLICATE: "measured already",
             Reason.KNOWN_LOSER: "known to lose"}
    why = next((t.user_attrs["why"] for t in pruned if t.user_attrs.get("why")), None)
    return "; ".join(f"{n} {words.get(r, r)}" + (f" (first: {why})" if r == Reason.KNOWN_LOSER and why else "")
                     for r, n in counts.items())


class FamilyTrials:
    """The families' trials as jobs: round-robin over the families with budget left (counting those in
    flight), a setting that changes something and is new (``ask_effective``), checked before any work."""

    def __init__(self, campaign: "Campaign", studies: dict[str, Any]) -> None:
        self.c, self.studies = campaign, studies
        self.req = campaign.spec.worker.request
        self.quality = campaign.spec.worker.quality  # a quality model's (source, request, ...)
        self.quality_req = self.quality.request if self.quality else None
        self.pending: dict[str, int] = {f: 0 for f in studies}
        self.exhausted: set[str] = set()  # families whose sampler only proposes no-ops or repeats
        self.out_of_time = False  # budget.minutes reached (said once)

    def _lease(self, trial: Any) -> None:
        """Lease a trial the moment it is asked (the end first: a live lease of no owner is left alone too), so a
        campaign starting on the same storage while this one samples or checks it does not FAIL it as interrupted."""
        trial.set_user_attr("lease_until", time.time() + LEASE_S)
        trial.set_user_attr("lease_owner", self.c.owner)
        trial.set_user_attr("lease_pid", os.getpid())

    def _running(self, study: Any) -> int:
        """Trials of ``study`` being measured: this driver's, and those another driver or an agent holds a
        live lease on (on a shared storage they count against the same budget)."""
        import optuna

        now = time.time()
        return sum(1 for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
                   if live_lease(t.user_attrs, now) is not None)

    def _out_of_time(self, setting: Setting | None = None) -> bool:
        """With ``budget.minutes``: whether one more trial would leave too little of it for the integrator's
        first combinations (``_reserved_combinations``) and the final bench (said once). For a drawn ``setting`` that compiles graphs no actor
        has built, at its own cost (``_evaluation_s_high``), and the reserve holds at least one combination of that
        cost: were it to survive, a combination with it compiles again (other techniques change its blocks)."""
        c = self.c
        if c.spec.time_budget_s is None:
            return False
        if self.out_of_time:  # (sticky: what is spent only grows, and a refused setting would be drawn again)
            return True
        per = c._per_evaluation_s()
        reserve = c._final_bench_s() + per * c._reserved_combinations([c.survivors(s) for s in self.studies.values()])
        cost = None
        if setting is not None and compile_signature(setting) is not None:
            cost = c._evaluation_s_high(setting)
            reserve = max(reserve, c._final_bench_s() + cost)
        if not c._over_budget(sum(self.pending.values()), reserve, cost):
            return False
        if not self.out_of_time:
            c.log(f"time budget: {c._spent_s():.0f} s of {c.spec.time_budget_s:.0f} s spent; the families stop here, "
                  f"keeping ~{reserve:.0f} s for the integrator and the final bench")
        self.out_of_time = True
        return True

    def next_job(self) -> Job | None:
        from vidtune.search.records import failure_reason
        from vidtune.techniques.setting import Setting, check_request

        c = self.c
        while True:
            if self._out_of_time() or c._no_time_to_start("the next trial"):
                return None
            used = {f: c._counted(s) + self._running(s) for f, s in self.studies.items()}
            open_ = [f for f in self.studies if f not in self.exhausted and used[f] < c.spec.trials_per_family]
            if not open_:
                return None
            family = min(open_, key=lambda f: used[f])  # the family with the fewest trials so far (round-robin)
            study = self.studies[family]
            if c.spec.probes:  # (the probes' next step, once those queued are measured)
                queue_follow_ups(study, family, self.req, c.log)
            trial, setting, skipped = ask_effective(study, family, self.req, reject=c.known_loser, on_ask=self._lease)
            if skipped:
                c.log(f"[{family}] {skipped} sampled setting(s) not measured: {skipped_reasons(study, skipped)}")
            if trial is None:
                c.log(f"[{family}] the sampler proposes only no-op or measured settings: the family's search stops")
                self.exhausted.add(family)
                continue
            try:
                setting = Setting.of(setting)  # (validated once here; what the actors get)
                check_request(setting, self.req, c._worker_device())  # names, values, seams, limits
                if self.quality is not None:  # and the same setting mapped to the quality model
                    try:
                        check_request(quality_setting(setting, self.quality)[0], self.quality_req, c._worker_device())
                    except (KnobError, CompositionError) as exc:
                        raise type(exc)(f"on the quality model {self.quality.source.identity()}: {exc}") from None
            except Exception as exc:  # invalid before any GPU work: a failed trial, and sample again
                kind, msg = failure_reason(exc)
                c._tell(study, trial, family, {"status": Status.FAIL, "reason": kind, "message": msg, "knobs": setting})
                continue
            if self._out_of_time(setting) or c._no_time_to_start("the next trial", c._evaluation_s_high(setting)):
                import optuna  # (a compile that would eat the integrator's share, or that the run's limit would cut)

                trial.set_user_attr("reason", Reason.INTERRUPTED)  # not started: queued again for the next run
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                study.enqueue_trial(trial.params, user_attrs={"requeued_from": trial.number, **queued_origin(trial)},
                                    skip_if_exists=False)
                return None
            self.pending[family] += 1

            def renew(trial: Any = trial) -> None:
                trial.set_user_attr("lease_until", time.time() + LEASE_S)

            def done(result: dict[str, Any], family: str = family, trial: Any = trial) -> None:
                self.pending[family] -= 1
                c._tell(self.studies[family], trial, family, result)

            renew()
            # (a probe is pruned only when slower than the baseline: the probes that pass are combined, dominated or not)
            front = None if not c.spec.prune else [] if PROBE in trial.user_attrs else front_points(c.survivors(study))
            return Job(setting, done, renew=renew, screen=c.spec.search_gate if c.spec.screen else None, front=front)


def queued_origin(trial: Any) -> dict[str, Any]:
    """Where a queued trial's setting came from (``seed_configs``, ``warm_start``, a probe), kept when it is queued
    again."""
    return {k: v for k, v in trial.user_attrs.items() if k in ("seeded_from", "warm_start_from", PROBE)}


class Combinations:
    """The integrator's combinations as jobs (``CombinationSearch``), each recorded as it finishes."""

    def __init__(self, campaign: "Campaign", search: CombinationSearch) -> None:
        self.c, self.search = campaign, search
        self.out_of_time = False

    def next_job(self) -> Job | None:
        c = self.c
        if c.spec.time_budget_s is not None and c._over_budget(len(self.search.pending), c._final_bench_s()):
            if not self.out_of_time:
                c.log(f"time budget: {c._spent_s():.0f} s of {c.spec.time_budget_s:.0f} s spent; the integrator stops "
                      f"here, keeping ~{c._final_bench_s():.0f} s for the final bench")
            self.out_of_time = True
            return None
        if c._no_time_to_start("the next combination"):
            return None
        setting = self.search.propose()
        if setting is None:
            return None
        if c._no_time_to_start("the next combination", c._evaluation_s_high(setting)):
            self.search.withdraw(setting)  # (a compile that would be cut: the next run proposes it again)
            return None

        def done(result: dict[str, Any]) -> None:
            ok = result.get("status") == Status.OK and self.c.spec.search_gate.passes(result["quality"])
            rec = {"family": "integrator", **{k: v for k, v in result.items() if k != "traceback"},
                   "knobs": setting, "combo": combo_key(setting), "passes_gate": ok, "time": time.time()}
            self.c._append(rec)
            self.search.tell(setting, rec)

        return Job(setting, done, screen=c.spec.search_gate if c.spec.screen else None)
