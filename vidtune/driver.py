"""The campaign driver: the phases of a campaign and their persistence, above search/ and integrator/.

A campaign is a baseline, one Optuna study per family side by side, the integrator's combinations, a
final interleaved bench and the export. Trials and combinations go through one dispatch loop to a pool
of Ray actors (one per GPU, or one on the CPU, each keeping the pipeline built); a failed one (exception,
NaN, OOM, timeout, dead actor) is recorded with its reason and the campaign goes on. Everything is
recorded as it finishes (the studies' storage, ``trials.jsonl``), so a killed campaign resumes in any
phase: the baseline is reused by its key, finished trials are kept and interrupted ones re-queued, the
recorded combinations and the final bench are not run again. search/ and integrator/ never import this module.
"""

from __future__ import annotations

import os
import socket
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from vidtune._io import atomic_write_text, strict_json
from vidtune.budget import TimeBudget
from vidtune.final_bench import FinalBench
from vidtune.integrator.combine import CombinationSearch, combinations, keep_if_faster, ranked
from vidtune.integrator.report import build_report
from vidtune.integrator.tuned import export_tuned_config
from vidtune.jobs import HEARTBEAT_S, LEASE_S, Combinations, FamilyTrials, Job, queued_origin
from vidtune.pool import ActorPool, actor_key, pick_actor
from vidtune.priors import Priors
from vidtune.search.campaign import (CampaignSpec, StopOnSignals, append_record, campaign_lock, check_resumed_quality,
                                     check_search_space, family_sampler, live_lease, overhead_summary,
                                     save_spec, search_plan, seed_params, storage_for, tell_result, warm_start_params,
                                     when)
from vidtune.search.knowledge import Finding
from vidtune.search.probes import queue_probes
from vidtune.search.records import Reason, RecordLog, Status
from vidtune.techniques.setting import compile_signature
from vidtune.verdicts import hold_verdicts, stricter_if_faster

__all__ = ["Campaign", "HEARTBEAT_S", "LEASE_S", "pick_actor", "ActorPool", "FamilyTrials"]


class Campaign(Priors, TimeBudget, FinalBench):
    """Run or resume a campaign: baseline, per-family studies, integrator, export."""

    def __init__(self, spec: CampaignSpec, log: Any = None, status: Any = None, pool: ActorPool | None = None) -> None:
        self.spec, self.pool = spec, pool  # pool: the caller's, adopted for this campaign and left running (else its own)
        # progress goes to stderr (stdout carries the command's JSON result); ``status(line, fraction)`` gets the
        # progress line, which search/progress.TerminalLog draws as a bar on a terminal
        self.log = log or (lambda message: print(message, file=sys.stderr, flush=True))
        self.status = status or (lambda line, fraction=None: self.log(line))
        self.dir = spec.directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.trials_log = self.dir / "trials.jsonl"
        # who leases its running trials: host and folder (the lock says no other driver of it lives: such a trial was interrupted)
        self.owner = f"{socket.gethostname()}:{os.path.realpath(self.dir)}"
        self.baseline_ms: float | None = None  # (known once the baseline phase ends)
        self.started = time.time()  # budget.run_minutes counts from here (the Ray and model start included)
        self.paused: str | None = None  # what this run did not start for budget.run_minutes
        self.compiled_here: set[str] = set()  # compile signatures this run's actors have built graphs for
        self._findings: list[Finding] | None = None  # the knowledge base, read once per run
        self._compiling: list[dict[str, Any]] | None = None  # earlier campaigns' compiles (Priors.earlier_compiling)

    # ------------------------------------------------------------------ studies
    def _studies(self, check_only: bool = False) -> dict[str, Any]:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = storage_for(self.spec, self.log)
        studies = {}
        if check_only:
            existing = {s.study_name for s in optuna.get_all_study_summaries(storage)}
            req = self.spec.worker.request
            for family in self.spec.families:
                name = f"{self.spec.name}:{family}"
                if name in existing:
                    check_search_space(optuna.load_study(study_name=name, storage=storage), family, req)
            return {}
        for family in self.spec.families:
            study = optuna.create_study(study_name=f"{self.spec.name}:{family}", storage=storage,
                                        directions=["minimize", "maximize"], load_if_exists=True)
            # the quality gate reaches the sampler as the trials' constraints (``set_constraints``)
            study.sampler = family_sampler(self.spec.seed, family, len(study.trials))
            study.set_metric_names(["latency_ms", "psnr_db"])
            self._requeue_interrupted(study, family, storage)
            new = not study.trials
            self._queue_seeds(study, family)
            if new:  # a new study starts where an expert would: the catalogue, earlier campaigns' findings
                self._queue_priors(study, family)
            if self.spec.warm_start and new:  # a new study: the earlier campaigns' best next
                for origin, params in warm_start_params(self.spec, family):
                    study.enqueue_trial(params, user_attrs={"warm_start_from": origin})
                    self.log(f"[{family}] warm start: {origin}'s setting queued first")
            if new and self.spec.probes:  # then each technique probed (search/probes.py), before TPE
                queue_probes(study, family, self.spec.worker.request, self.log)
            studies[family] = study
        return studies

    def _queue_seeds(self, study: Any, family: str) -> None:
        """Queue each seed config's part of ``family`` (``seed_configs``) first, as parameters of the family's own
        sampling; on a resumed study too (a seed added later is measured), never twice."""
        req = self.spec.worker.request
        for seed in self.spec.seeds:
            params, what = seed_params(family, seed["knobs"], req)
            if params is None:
                if what:
                    self.log(f"[{family}] seed {seed['origin']}: {what}: not queued")
                continue
            if any(t.params == params or t.system_attrs.get("fixed_params") == params
                   for t in study.get_trials(deepcopy=False)):
                continue  # queued or measured by an earlier run of this campaign
            study.enqueue_trial(params, user_attrs={"seeded_from": seed["origin"]}, skip_if_exists=False)
            self.log(f"[{family}] seed: {seed['origin']}'s {what} queued")

    def _requeue_interrupted(self, study: Any, family: str, storage: Any = None) -> None:
        """Trials left RUNNING by a killed campaign: FAIL (interrupted) and queued again, same params. A trial
        whose lease is live and someone else's (an agent, another host's driver) is left to it. (Through the
        storage's public API: a Study tells only the trials it asked.)"""
        import optuna

        storage = storage if storage is not None else storage_for(self.spec)  # (the study's: the campaign's storage)
        study_id = storage.get_study_id_from_name(study.study_name)
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            lease, owner = live_lease(t.user_attrs), t.user_attrs.get("lease_owner")
            if lease is not None and owner != self.owner:
                # live, and another's: an agent's (vidtune ask) or another driver's on this storage
                self.log(f"[{family}] trial {t.number} is leased to {owner or 'an agent'} until {when(lease)}: left to it")
                continue
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
            storage.set_trial_user_attr(trial_id, "reason", Reason.INTERRUPTED)
            storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL)
            params = {k: v for k, v in t.params.items()}
            if not params:  # killed between ask and sampling: nothing to repeat, a fresh trial is the same
                self.log(f"[{family}] trial {t.number} was interrupted before its setting was sampled")
                continue
            # (killed while sampling: the sampled part is fixed, the rest is sampled again)
            study.enqueue_trial(params, user_attrs={"requeued_from": t.number, **queued_origin(t)}, skip_if_exists=False)
            self.log(f"[{family}] trial {t.number} was interrupted: re-queued")

    def _worker_device(self) -> str | None:
        """The device the trial actors run on (for device-dependent knob checks), when it is known."""
        device = self.spec.worker.device if self.spec.worker is not None else None
        return None if device in (None, "auto") else device

    @staticmethod
    def _counted(study: Any) -> int:
        """Trials that count against the budget: finished ones, not the interrupted."""
        import optuna

        done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL))
        return sum(1 for t in done if t.user_attrs.get("reason") != Reason.INTERRUPTED)

    # ------------------------------------------------------------------ records
    def _append(self, record: dict[str, Any]) -> None:
        append_record(self.spec, record)

    def _records(self, family: str) -> list[dict[str, Any]]:
        """The records of ``family`` in trials.jsonl (a line torn by a kill is skipped: its work re-runs)."""
        return [rec for rec in self._all_records() if rec.get("family") == family]

    def _all_records(self) -> list[dict[str, Any]]:
        return RecordLog(self.trials_log).read()

    def _tell(self, study: Any, trial: Any, family: str, result: dict[str, Any]) -> None:
        tell_result(self.spec, study, trial, family, result)
        paired, screened = result.get("paired") or {}, (result.get("screened") or {}).get("reason")
        if screened or (pruned := paired.get("pruned")):
            self.log(f"[{family}] trial {trial.number} " + (f"not timed after its warm-up: {screened}" if screened
                                                            else f"stopped after {'its estimate' if paired.get('repeats') == 0 else 'its first pair'}: {pruned}"))

    # ------------------------------------------------------------------ main loop
    def run(self) -> dict[str, Any]:
        """The whole campaign; returns a summary (also ``campaign.json``). A second run of the same campaign
        while this one lives raises ``CampaignBusy`` before it touches anything."""
        with campaign_lock(self.spec.directory), StopOnSignals() as signals, search_plan(self.spec):
            return self._run(signals)

    def _dispatch(self, pool: ActorPool, source: Any, progress: Callable[[list[float]], None]) -> None:
        """The one dispatch loop, for the families' trials and the integrator's combinations alike: fill the
        free actors with ``source.next_job()`` (None: nothing to start now), collect what finishes, and
        hand each result to its job's ``done``. A job past ``trial_timeout_s`` is told a timeout failure
        and its actor replaced; an actor that died is recorded as such and replaced. Ends when nothing is
        in flight and the source has nothing to start."""
        ray = pool.ray
        in_flight: dict[Any, tuple[Job, Any, float]] = {}  # ref -> (job, actor, started)
        free = list(pool.actors)
        compiled: dict[Any, str] = {}  # actor -> the compiled configuration it ran last (its graphs are warm)
        durations: list[float] = []
        beat = time.time()
        while True:
            if time.time() - beat >= HEARTBEAT_S:  # the running jobs' leases
                beat = time.time()
                for job, _, _ in in_flight.values():
                    if job.renew is not None:
                        job.renew()
            while free:
                job = source.next_job()
                if job is None:
                    break
                signature = compile_signature(job.setting)
                actor = pick_actor(free, signature, compiled)
                if signature is not None:
                    compiled[actor_key(actor)] = signature
                    self.compiled_here.add(signature)
                in_flight[actor.evaluate.remote(job.setting, job.scoped, None, job.screen, job.front)] = (job, actor, time.time())
            if not in_flight:
                break
            deadline = min(t0 for _, _, t0 in in_flight.values()) + self.spec.trial_timeout_s
            ready = pool.wait(list(in_flight), timeout=max(0.0, min(1.0, deadline - time.time())))
            now = time.time()
            for ref in ready:
                job, actor, t0 = in_flight.pop(ref)
                try:
                    result = ray.get(ref)
                except Exception as exc:  # the actor died: record, replace
                    result = {"status": Status.FAIL, "reason": Reason.ACTOR_DIED, "message": str(exc)[:500], "knobs": job.setting}
                    actor = pool.replace(actor)
                if result.get("replace_worker"):  # a failure left its process's memory held (search/gpu_memory.py)
                    self.log(f"actor replaced after a failed {job.setting}: {result['replace_worker']}")
                    actor = pool.replace(actor)
                if now - t0 > self.spec.trial_timeout_s:  # finished, but past its time limit
                    result = {"status": Status.FAIL, "reason": Reason.TIMEOUT, "knobs": job.setting,
                              "message": f"took {now - t0:.2f} s, limit {self.spec.trial_timeout_s} s"}
                job.done(result)
                durations.append(now - t0)
                free.append(actor)
                progress(durations)
            for ref, (job, actor, t0) in list(in_flight.items()):
                if now - t0 > self.spec.trial_timeout_s:
                    in_flight.pop(ref)
                    job.done({"status": Status.FAIL, "reason": Reason.TIMEOUT, "knobs": job.setting,
                              "message": f"exceeded {self.spec.trial_timeout_s} s"})
                    free.append(pool.replace(actor))

    def _run(self, signals: StopOnSignals | None = None) -> dict[str, Any]:
        check_resumed_quality(self.spec)  # a resumed campaign's quality numbers come from where they came from
        save_spec(self.spec)
        self._studies(check_only=True)  # a resumed campaign's search space still fits, before any model work
        pool = self.pool.adopt(self.spec) if self.pool is not None else ActorPool(self.spec)
        if signals is not None:
            signals.install()  # (over the handler ray.init installed)
        try:
            self.log("baseline: running or reusing it on the first actor")
            baseline = pool.get(pool.actors[0].ensure_baseline.remote(), tick=self._tail(pool.progress_file))
            self.log(f"baseline {'reused' if baseline['reused'] else 'computed'}: {baseline['total_ms']:.1f} ms "
                     f"(key {baseline['key'][:12]})" + ("" if baseline["reused"] else
                     f"; {baseline.get('generations')} generations and metrics in {baseline.get('seconds', 0):.1f} s"))
            self.baseline_ms = baseline["total_ms"]
            for actor in pool.actors[1:]:
                pool.get(actor.ping.remote())
            studies = self._studies()
            started_at = time.time()
            self._dispatch(pool, FamilyTrials(self, studies),
                           lambda durations: self._progress(studies, durations, len(pool.actors), started_at))
            self._pause_if_out_of_run_time()
            survivors = {f: self.survivors(s) for f, s in studies.items()}
            outcome = self._integrate(pool, survivors, baseline)
            summary = {"campaign": self.spec.name, "baseline": baseline, "survivors": survivors, **outcome,
                       "overhead": overhead_summary(self._all_records())}
            atomic_write_text(self.dir / "campaign.json", strict_json(summary, indent=2))
            pool.wait_baseline_mp4(self.log)  # (the report shows it beside the tuned video)
            summary["report"] = str(build_report(self.dir))
            self.log(f"report: {summary['report']}")
            return summary
        finally:
            if self.pool is None:
                pool.shutdown()

    def _tail(self, path: Path) -> Callable[[], None]:
        """A poll that logs the lines appended to ``path`` since the last poll (from its size now)."""
        pos = [path.stat().st_size if path.is_file() else 0]

        def tick() -> None:
            if not path.is_file():
                return
            with open(path, "rb") as f:
                f.seek(pos[0])
                data = f.read()
            done = data.rfind(b"\n") + 1  # whole lines only
            pos[0] += done
            for line in data[:done].decode(errors="replace").splitlines():
                self.log(line)

        return tick

    # ------------------------------------------------------------------ integrator phase
    def _integrate(self, pool: ActorPool, survivors: dict[str, list[dict]], baseline: dict[str, Any]) -> dict[str, Any]:
        """Combinations of the survivors through the same dispatch loop, each recorded as it finishes; the
        fastest gated one re-measured interleaved (that bench recorded too) and exported. A resume tells
        the search the recorded combinations first and re-runs only what had not finished."""
        spec, log = self.spec, self.log
        search = CombinationSearch(survivors, spec.search_gate, seed=spec.seed, max_exhaustive=spec.integrator_max_exhaustive,
                                   trials=spec.integrator_trials, baseline_ms=baseline["total_ms"],
                                   merge=spec.integrator_merge)
        reused = self._measured_survivors(survivors)
        for knobs, rec in reused:
            search.seed_measured(knobs, rec)
        done_before = [r for r in self._records("integrator") if r.get("combo") and r.get("phase") not in ("final", "verdict")]
        for rec in done_before:
            search.tell(rec["knobs"], rec)
        if reused:
            log(f"integrator: {len(reused)} single-family combination(s) are their family's trials, measured "
                f"already: not run again")
        how = "every one" if search.exhaustive else f"an Optuna search of {search.total}"
        merges = sum(len(v) for v in search.candidates.values()) - sum(len(v) for v in survivors.values())
        log(f"integrator: {len(combinations(search.candidates))} combination(s) of {sum(len(v) for v in survivors.values())} "
            f"survivor(s)" + (f" and {merges} merge(s) of two of a family's" if merges else "") + f", {how}" + (f"; {len(done_before)} recorded by an earlier run" if done_before else ""))
        started_at = time.time()

        def progress(durations: list[float]) -> None:
            left = max(0, search.total - len(search.results))
            final_s = self._final_bench_s()
            eta = statistics.median(durations) * left / max(1, len(pool.actors)) + final_s
            elapsed = time.time() - started_at
            self.status(f"integrator: {len(search.results)}/{search.total} combination(s) | ETA {eta:.0f} s (the final "
                        f"bench {final_s:.0f} s of it), elapsed {elapsed:.0f} s", elapsed / max(elapsed + eta, 1e-9))

        self._dispatch(pool, Combinations(self, search), progress)
        self._pause_if_out_of_run_time()
        evaluated = search.evaluated()
        finals = {r["combo"]: r["result"] for r in self._records("integrator") if r.get("phase") == "final"}

        def bench(knobs: dict, out: str = "tuned") -> dict[str, Any]:
            return self._final_bench(pool, finals, knobs, out)

        tiers = spec.tiers or ((None, spec.gate),)
        # (a combination passing a tier's gate passes the search's, so its "faster" was measured)
        candidates = {tier: ranked([{**e, "passes_gate": e["status"] == Status.OK and gate.passes(e["quality"] or {})}
                                    for e in evaluated]) for tier, gate in tiers}
        choices, verdicts = hold_verdicts(self, pool, tiers, candidates)  # (before the bench: it costs less)
        self._bench_together(choices, finals, pool)
        outcomes: dict[str | None, dict[str, Any]] = {}
        for tier, gate in tiers:
            label = f"tier {tier}: " if tier else ""
            chosen = choices[tier]
            if not chosen and not (verdicts.get(tier) or {}).get("did_not_hold"):  # (else said by hold_verdicts)
                log(f"integrator: {label}no combination passes the gate and is faster than the baseline beyond the "
                    f"noise; the tuned config is the baseline (no techniques)")
            out = f"tuned-{tier}" if tier else "tuned"
            chosen, final, rejected = keep_if_faster(chosen, bench(chosen, out), lambda k, o=out: bench(k, o), log,
                                                     spec.integrator_max_p)
            own = dict(chosen=chosen, final=final, rejected=rejected, verdict=verdicts.get(tier))
            took = stricter_if_faster(tier, gate, own, outcomes, log)
            chosen, final, rejected, verdict = took["chosen"], took["final"], took["rejected"], took["verdict"]
            what = f"{chosen}: x{final['speedup']:.3f} vs baseline, p={final['p_value']:.3g}" if chosen else (
                f"baseline (no techniques): x{final['speedup']:.3f} against itself (the measurement's noise)")
            log(f"tuned: {label}{what} (interleaved, {spec.final_repeats} repeats), PSNR "
                f"{final['quality']['psnr_db']:.2f} dB")
            # (the verdict goes in the tuned config only with a setting it is the verdict of)
            path = export_tuned_config(spec, chosen, final, baseline, rejected, (tier, gate) if tier else None, chosen and verdict)
            log(f"tuned config: {path}")
            outcomes[tier] = dict(chosen=chosen, final=final, rejected=rejected, tuned_config=str(path), verdict=verdict)
        first = outcomes[tiers[0][0]]
        result = {"integrator": evaluated, **first}
        if spec.tiers:  # tuned.yaml: the strictest tier's (what a reader of one file should get: the safest)
            atomic_write_text(spec.directory / "tuned.yaml", Path(first["tuned_config"]).read_text())
            result["tiers"] = {t: {**o, "gate": asdict(g)} for (t, g), o in zip(tiers, outcomes.values())}
        return result

    def _measured_survivors(self, survivors: dict[str, list[dict]]) -> list[tuple[dict, dict[str, Any]]]:
        """Each survivor as a one-family combination with its trial's record (measured the same way, paired with
        the same baseline): the integrator counts it as evaluated instead of measuring it again."""
        out = []
        for family, front in survivors.items():
            records = {r.get("trial"): r for r in self._records(family) if r.get("status") == Status.OK}
            for s in front:
                rec = records.get(s["trial"])  # (one recorded at its estimate, without pairs, is measured here)
                if rec is not None and rec.get("knobs") == s["knobs"] and (rec.get("paired") or {}).get("repeats", 1):
                    out.append((s["knobs"], {**rec, "reused_from": f"{family}#{s['trial']}"}))
        return out

    def survivors(self, study: Any) -> list[dict[str, Any]]:
        """The family's feasible Pareto front (latency down, PSNR up) as knob settings with scores."""
        import optuna

        # feasible, and faster than the baseline beyond the noise where the trial was measured paired
        done = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
                if t.user_attrs.get("feasible") and (t.user_attrs.get("paired") or {}).get("faster", True)]
        front = []
        for t in done:
            lat, psnr = t.values
            dominated = any(o.values[0] <= lat and o.values[1] >= psnr and (o.values[0] < lat or o.values[1] > psnr)
                            for o in done)
            if not dominated and t.user_attrs.get("knobs"):
                front.append({"trial": t.number, "knobs": t.user_attrs["knobs"], "total_ms": lat, "psnr_db": psnr})
        return sorted(front, key=lambda x: x["total_ms"])

    def _progress(self, studies: dict[str, Any], durations: list[float], actors: int, started: float) -> None:
        """A status per finished trial: each family's count and best, and an ETA: the families' trials and the integrator's
        combinations (those the survivors make, at most its budget) at the trials' mean duration, and the final bench."""
        parts, remaining, fronts = [], 0, []
        for family, study in studies.items():
            n = self._counted(study)
            remaining += max(0, self.spec.trials_per_family - n)
            best = self.survivors(study)
            fronts.append(best)
            best_txt = f"best {best[0]['total_ms']:.1f} ms @ {best[0]['psnr_db']:.1f} dB" if best else "no feasible yet"
            parts.append(f"{family} {n}/{self.spec.trials_per_family} ({best_txt})")
        if not durations:
            return self.status(" | ".join(parts), 0.0)
        combos = self._expected_combinations(fronts)
        per = sum(durations) / len(durations)
        families_s = per * remaining / max(1, actors)
        integrator_s = per * combos / max(1, actors)
        final_s = self._final_bench_s()
        eta = families_s + integrator_s + final_s
        elapsed = time.time() - started
        self.status(" | ".join(parts) + f" | ETA {eta:.0f} s (families {families_s:.0f}, integrator ~{combos} "
                    f"combination(s) {integrator_s:.0f}, final bench {final_s:.0f}), elapsed {elapsed:.0f} s",
                    elapsed / max(elapsed + eta, 1e-9))
