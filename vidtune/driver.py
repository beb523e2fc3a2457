"""The campaign driver: the phases of a campaign and their persistence, above search/ and integrator/.

A campaign is a baseline, one Optuna study per family side by side, the integrator's combinations, a
final interleaved bench and the export. Trials and combinations go through one dispatch loop to a pool
of Ray actors (one per GPU, or one on the CPU, each keeping the pipeline built); a failed one (exception,
NaN, OOM, timeout, dead actor) is recorded with its reason and the campaign goes on. Everything is
recorded as it finishes (the studies' storage, ``trials.jsonl``), so a killed campaign resumes in any
phase: the baseline is reused by its key, finished trials are kept and interrupted ones re-queued, the
recorded combinations and the final bench are not run again.

search/ and integrator/ never import this module (docs/architecture.md).
"""

from __future__ import annotations

import json
import math
import os
import socket
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from vidtune.integrator.combine import CombinationSearch, choose, combinations, combo_key, family_candidates, keep_if_faster
from vidtune.integrator.report import build_report
from vidtune.integrator.tuned import export_tuned_config
from vidtune._io import atomic_write_text, strict_json
from vidtune.search.catalogue import GpuClass, avoided, gpu_class, starting_points
from vidtune.search.knowledge import Finding, earlier_findings, losers, winners
from vidtune.search.records import RecordLog
from vidtune.search.worker import actor_threads, quality_setting
from vidtune.techniques.registry import CompositionError, KnobError, compile_signature
from vidtune.search.campaign import (CampaignPaused, CampaignSpec, _search_plan, _StopOnSignals, ask_effective, campaign_lock,
                                     append_record, check_resumed_quality, check_search_space, check_stop,
                                     family_sampler, save_spec,
                                     live_lease, overhead_summary, seed_params, storage_for, tell_result,
                                     warm_start_params, when)

__all__ = ["Campaign", "HEARTBEAT_S", "LEASE_S", "pick_actor"]

# A running trial is leased to the driver measuring it (``lease_until``, ``lease_owner``), renewed every
# HEARTBEAT_S while it runs: a campaign started meanwhile elsewhere on the same storage (another host, or an
# agent's `vidtune ask`) leaves a live lease alone, and takes over an expired one (its driver died).
# Optuna's own heartbeat runs only inside study.optimize, which the driver does not use (ask/tell).
HEARTBEAT_S = 30.0
LEASE_S = 120.0


class _Pool:
    """Ray actors evaluating trials; a timed-out or dead actor is killed and replaced."""

    def __init__(self, spec: CampaignSpec) -> None:
        # docs/environment.md: with this variable a local Ray binds 127.0.0.1 only; no auth token file. Ray reads
        # it when it is imported (ray_constants), so it is set before the import: set after, the campaign's
        # Ray listened on [::] and the node's address (seen with a real campaign; the tests, which set it
        # first, never saw it)
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        import ray

        self.ray = ray
        self.spec = spec
        self._init_ray()
        import torch

        gpus = torch.cuda.device_count() if spec.worker.get("device", "cpu").startswith("cuda") else 0
        ranks = spec.ranks_per_actor
        if gpus and ranks > gpus:
            raise ValueError(f"ray.ranks_per_actor={ranks} needs {ranks} GPUs per actor; this machine has {gpus}")
        self.num_gpus_per_actor = ranks if gpus else 0
        n = spec.num_actors or max(1, gpus // ranks)
        # torch's CPU threads in each actor (Ray starts one of num_cpus=1 with 1): a local Ray's actors share this
        # host's cores; on a cluster each actor takes its node's share (its cores over its GPUs)
        self.threads = actor_threads(n) if not spec.ray_address else -1
        self.actors = [self._new_actor() for _ in range(n)]

    def _init_ray(self) -> None:
        ray = self.ray
        self.owns_ray = not ray.is_initialized()
        if not self.owns_ray:
            return
        if self.spec.ray_address:
            ray.init(address=self.spec.ray_address, logging_level="ERROR", log_to_driver=False)
        else:
            # address="local": always a new instance of its own. Without it Ray joins a cluster it finds running
            # on this machine (`ray start`), and with num_cpus given refuses to (seen: a campaign started while
            # the scale-out test's head ran on the same machine failed in ray.init)
            ray.init(address="local", include_dashboard=False, logging_level="ERROR", log_to_driver=False,
                     _node_ip_address="127.0.0.1", num_cpus=max(2, os.cpu_count() or 2))

    def _new_actor(self) -> Any:
        from vidtune.search.worker import TrialWorker, WorkerSpec

        ranks = self.spec.ranks_per_actor
        if ranks > 1:  # rank 0 of a process group of ``ranks`` (helpers are its child processes)
            from vidtune.search.parallel_worker import ParallelTrialWorker

            cls = self.ray.remote(num_gpus=self.num_gpus_per_actor, num_cpus=1, max_restarts=0)(ParallelTrialWorker)
            return cls.remote(WorkerSpec(**{**self.spec.worker, "progress_file": str(self.progress_file)}), ranks,
                              self.spec.trial_timeout_s)
        cls = self.ray.remote(num_gpus=self.num_gpus_per_actor, num_cpus=1, max_restarts=0)(TrialWorker)
        return cls.remote(WorkerSpec(**{**self.spec.worker, "progress_file": str(self.progress_file),
                                        "threads": self.threads}))

    @property
    def progress_file(self) -> Path:
        """Where the actors append their progress lines (the baseline's generations); the driver shows them."""
        return self.spec.directory / "progress.log"

    def get(self, ref: Any, tick: Callable[[], None] | None = None) -> Any:
        """``ray.get`` in half-second polls that a stop signal interrupts (``check_stop``); ``tick`` runs at
        each poll (the baseline's progress lines)."""
        while True:
            ready, _ = self.ray.wait([ref], num_returns=1, timeout=0.5)
            check_stop()
            if tick is not None:
                tick()
            if ready:
                return self.ray.get(ref)

    def wait(self, refs: list[Any], timeout: float | None = None) -> list[Any]:
        """The refs of ``refs`` ready within ``timeout`` (None: at least one), polled like ``get``."""
        end = None if timeout is None else time.time() + timeout
        while True:
            step = 0.5 if end is None else max(0.0, min(0.5, end - time.time()))
            ready, _ = self.ray.wait(list(refs), num_returns=1, timeout=step)
            check_stop()
            if ready or (end is not None and time.time() >= end):
                return ready

    def _kill(self, actor: Any) -> None:
        try:
            self.ray.kill(actor)
        except Exception:  # already dead (the reason it is being replaced)
            return

    def replace(self, actor: Any) -> Any:
        self._kill(actor)
        new = self._new_actor()
        self.actors[self.actors.index(actor)] = new
        return new

    def wait_baseline_mp4(self, log: Callable[[str], None]) -> None:
        """At the normal end of a campaign: let the first actor finish the baseline's MP4 (written in the
        background) before the actors are killed. Not on a stop or an error: the wait would queue behind a
        running trial, and the baseline itself is whole without its MP4."""
        try:
            if not self.ray.get(self.actors[0].wait_baseline_files.remote(600.0), timeout=660):
                log("baseline: its MP4 was not finished after 600 s; left out")
        except Exception as exc:  # a dead actor, or the MP4's encode failed
            log(f"baseline: its MP4 is missing ({type(exc).__name__}: {str(exc)[:200]}); the baseline itself is whole")

    def shutdown(self) -> None:
        for a in self.actors:
            self._kill(a)
        if self.owns_ray:
            self.ray.shutdown()


def _actor_key(actor: Any) -> Any:
    actor_id = getattr(actor, "_actor_id", None)
    return actor_id.hex() if actor_id is not None else id(actor)


def pick_actor(free: list[Any], signature: str | None, compiled: dict[Any, str]) -> Any:
    """Take the free actor a job should run on: for a job that compiles (``signature``), the actor that ran
    that compiled configuration last (its graphs are in its process: no compile), else one that holds no
    compiled configuration (keeping the others' for their kind); a job that compiles nothing goes to an
    actor without compiled graphs where there is one. A replaced actor holds nothing (its key is new)."""
    def holds(actor: Any) -> str | None:
        return compiled.get(_actor_key(actor))

    choice = None
    if signature is not None:
        choice = next((a for a in free if holds(a) == signature), None)
    if choice is None:
        choice = next((a for a in reversed(free) if holds(a) is None), None)
    if choice is None:
        choice = free[-1]
    free.remove(choice)
    return choice


@dataclass
class _Job:
    """One evaluation to dispatch: a family's trial or a combination; ``done`` takes its result."""

    setting: dict[str, dict[str, Any]]
    done: Callable[[dict[str, Any]], None]
    scoped: bool = True
    renew: Callable[[], None] | None = None  # the heartbeat: extend the job's lease


class _FamilyTrials:
    """The families' trials as jobs: round-robin over the families with budget left (counting those in
    flight), a setting that changes something and is new (``ask_effective``), checked before any work."""

    def __init__(self, campaign: "Campaign", studies: dict[str, Any]) -> None:
        from vidtune.model import GenerationRequest

        self.c, self.studies = campaign, studies
        self.req = GenerationRequest.from_dict(campaign.spec.worker["request"])
        self.quality = campaign.spec.worker.get("quality")  # a quality model's spec (source, request, geometry)
        self.quality_req = GenerationRequest.from_dict(self.quality["request"]) if self.quality else None
        self.pending: dict[str, int] = {f: 0 for f in studies}
        self.exhausted: set[str] = set()  # families whose sampler only proposes no-ops or repeats
        self.out_of_time = False  # budget.minutes reached (said once)

    def _running(self, study: Any) -> int:
        """Trials of ``study`` being measured: this driver's, and those another driver or an agent holds a
        live lease on (on a shared storage they count against the same budget)."""
        import optuna

        now = time.time()
        return sum(1 for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
                   if live_lease(t.user_attrs, now) is not None)

    def _out_of_time(self) -> bool:
        """With ``budget.minutes``: whether one more trial would leave too little of it for the integrator's
        expected combinations and the final bench (said once)."""
        c = self.c
        if c.spec.time_budget_s is None:
            return False
        per = c._per_evaluation_s()
        reserve = c._final_bench_s() + per * c._expected_combinations([c.survivors(s) for s in self.studies.values()])
        if not c._over_budget(sum(self.pending.values()), reserve):
            return False
        if not self.out_of_time:
            c.log(f"time budget: {c._spent_s():.0f} s of {c.spec.time_budget_s:.0f} s spent; the families stop here, "
                  f"keeping ~{reserve:.0f} s for the integrator and the final bench")
        self.out_of_time = True
        return True

    def next_job(self) -> _Job | None:
        from vidtune.search.worker import failure_reason
        from vidtune.techniques.registry import check_request

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
            trial, setting, skipped = ask_effective(study, family, self.req, reject=c.known_loser)
            if skipped:
                c.log(f"[{family}] {skipped} sampled setting(s) changed nothing for this request or were "
                      f"measured already: skipped")
            if trial is None:
                c.log(f"[{family}] the sampler proposes only no-op or measured settings: the family's search stops")
                self.exhausted.add(family)
                continue
            try:
                check_request(setting, self.req, c._worker_device())  # names, values, seams, limits
                if self.quality is not None:  # and the same setting mapped to the quality model
                    try:
                        check_request(quality_setting(setting, self.quality)[0], self.quality_req, c._worker_device())
                    except (KnobError, CompositionError) as exc:
                        raise type(exc)(f"on the quality model {self.quality['source']}: {exc}") from None
            except Exception as exc:  # invalid before any GPU work: a failed trial, and sample again
                kind, msg = failure_reason(exc)
                c._tell(study, trial, family, {"status": "fail", "reason": kind, "message": msg, "knobs": setting})
                continue
            if c._no_time_to_start("the next trial", c._evaluation_s_high(setting)):  # (a compile it would cut)
                import optuna

                trial.set_user_attr("reason", "interrupted")  # not started: queued again for the next run
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                study.enqueue_trial(trial.params, user_attrs={"requeued_from": trial.number, **_origin(trial)},
                                    skip_if_exists=False)
                return None
            self.pending[family] += 1
            trial.set_user_attr("lease_owner", c.owner)
            trial.set_user_attr("lease_pid", os.getpid())

            def renew(trial: Any = trial) -> None:
                trial.set_user_attr("lease_until", time.time() + LEASE_S)

            def done(result: dict[str, Any], family: str = family, trial: Any = trial) -> None:
                self.pending[family] -= 1
                c._tell(self.studies[family], trial, family, result)

            renew()
            return _Job(setting, done, renew=renew)


def _origin(trial: Any) -> dict[str, Any]:
    """Where a queued trial's setting came from (``seed_configs``, ``warm_start``), kept when it is queued again."""
    return {k: v for k, v in trial.user_attrs.items() if k in ("seeded_from", "warm_start_from")}


class _Combinations:
    """The integrator's combinations as jobs (``CombinationSearch``), each recorded as it finishes."""

    def __init__(self, campaign: "Campaign", search: CombinationSearch) -> None:
        self.c, self.search = campaign, search
        self.out_of_time = False

    def next_job(self) -> _Job | None:
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
            ok = result.get("status") == "ok" and self.c.spec.search_gate.passes(result["quality"])
            rec = {"family": "integrator", **{k: v for k, v in result.items() if k != "traceback"},
                   "knobs": setting, "combo": combo_key(setting), "passes_gate": ok, "time": time.time()}
            self.c._append(rec)
            self.search.tell(setting, rec)

        return _Job(setting, done)


class Campaign:
    """Run or resume a campaign: baseline, per-family studies, integrator, export."""

    def __init__(self, spec: CampaignSpec, log: Any = None) -> None:
        self.spec = spec
        # progress goes to stderr: stdout carries the command's JSON result
        self.log = log or (lambda message: print(message, file=sys.stderr, flush=True))
        self.dir = spec.directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.trials_log = self.dir / "trials.jsonl"
        # who leases this campaign's running trials: this host and campaign folder (the campaign lock says
        # no other driver of this folder lives, so a trial leased to it is an interrupted one)
        self.owner = f"{socket.gethostname()}:{os.path.realpath(self.dir)}"
        self.baseline_ms: float | None = None  # (known once the baseline phase ends)
        self.started = time.time()  # budget.run_minutes counts from here (the Ray and model start included)
        self.paused: str | None = None  # what this run did not start for budget.run_minutes
        self.compiled_here: set[str] = set()  # compile signatures this run's actors have built graphs for
        self._findings: list[Finding] | None = None  # the knowledge base, read once per run

    # ------------------------------------------------------------------ studies
    def _studies(self, check_only: bool = False) -> dict[str, Any]:
        import optuna

        from vidtune.model import GenerationRequest

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = storage_for(self.spec, self.log)
        studies = {}
        if check_only:
            existing = {s.study_name for s in optuna.get_all_study_summaries(storage)}
            req = GenerationRequest.from_dict(self.spec.worker["request"])
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
            self._requeue_interrupted(study, family)
            new = not study.trials
            self._queue_seeds(study, family)
            if new:  # a new study starts where an expert would: the catalogue, then earlier campaigns' findings
                self._queue_priors(study, family)
            if self.spec.warm_start and new:  # a new study: the earlier campaigns' best next
                for origin, params in warm_start_params(self.spec, family):
                    study.enqueue_trial(params, user_attrs={"warm_start_from": origin})
                    self.log(f"[{family}] warm start: {origin}'s setting queued first")
            studies[family] = study
        return studies

    def gpu_class(self) -> GpuClass:
        """The class of the GPU the trials run on (the driver's view of the worker's device)."""
        import torch

        device = str((self.spec.worker or {}).get("device") or "cpu")
        if device.startswith("cuda") and torch.cuda.is_available():
            index = int(device.split(":")[1]) if ":" in device else 0
            return gpu_class(torch.cuda.get_device_name(index))
        return GpuClass.CPU if device == "cpu" else GpuClass.OTHER_GPU

    def findings(self) -> list[Finding]:
        """What earlier campaigns of this model on this GPU class measured (the knowledge base), once per run."""
        if self._findings is None:
            from vidtune.model import GenerationRequest, ModelSource
            from vidtune.search.worker import geometry

            src = dict(self.spec.worker["source"])
            here = geometry(ModelSource(**{k: (tuple(v) if k == "stg_blocks" and v is not None else v)
                                           for k, v in src.items()}),
                            GenerationRequest.from_dict(self.spec.worker["request"]))
            self._findings = earlier_findings(self.spec.results_dir, self.spec.name, src, self.gpu_class(), here) \
                if self.spec.knowledge else []
        return self._findings

    def _queue_priors(self, study: Any, family: str) -> None:
        """A new family study's first trials: the catalogue's starting points for this GPU class and mode (exact
        before near-exact before approximate), then the best findings of earlier campaigns (knowledge base)."""
        from vidtune.model import GenerationRequest

        req = GenerationRequest.from_dict(self.spec.worker["request"])
        queued: list[dict[str, Any]] = []
        candidates: list[tuple[str, dict[str, dict[str, Any]]]] = []
        if self.spec.catalogue:
            candidates += [(f"catalogue {p.name} ({p.kind.name.lower()})", p.knobs)
                           for p in starting_points(self.gpu_class(), req.mode)]
        candidates += [(f"earlier campaign {f.origin} (x{1 / f.ratio:.3f})", f.knobs)
                       for f in winners(self.findings(), family)]
        for origin, knobs in candidates:
            params, _ = seed_params(family, knobs, req)
            if params is None or params in queued:
                continue
            study.enqueue_trial(params, user_attrs={"seeded_from": origin}, skip_if_exists=False)
            queued.append(params)
            self.log(f"[{family}] queued first: {origin}")

    def known_loser(self, setting: dict[str, dict[str, Any]]) -> str | None:
        """Why ``setting`` is not worth measuring on this GPU class (None: it is): a catalogue loser, or a
        technique's setting an earlier campaign measured slower than its baseline alone."""
        from vidtune.techniques import get, resolve_values

        if self.spec.catalogue:
            rule = avoided(setting, self.gpu_class())
            if rule is not None:
                return f"{rule.technique}.{rule.knob}: {rule.why}"
        if self.spec.knowledge:
            lost = losers(self.findings())
            for name, values in resolve_values(setting).items():
                full = get(name).validate(values)
                for other, origin in lost.get(name, ()):
                    if get(name).validate(other) == full:
                        return f"{name} {values} measured slower than the baseline in {origin}"
        return None

    def _queue_seeds(self, study: Any, family: str) -> None:
        """Queue each seed config's part of ``family`` (``seed_configs``), first, as parameters of the family's
        own sampling (so the sampler learns from it like from any trial). On a resumed study too, so a seed
        added later is measured; a part already queued or measured is not queued again."""
        from vidtune.model import GenerationRequest

        req = GenerationRequest.from_dict(self.spec.worker["request"])
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

    def _requeue_interrupted(self, study: Any, family: str) -> None:
        """Trials left RUNNING by a killed campaign: FAIL (interrupted) and queued again, same params. A trial
        whose lease is live and someone else's (an agent, another host's driver) is left to it."""
        import optuna

        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            lease, owner = live_lease(t.user_attrs), t.user_attrs.get("lease_owner")
            if lease is not None and owner != self.owner:
                # live, and another's: an agent's (vidtune ask) or another driver's on this storage
                self.log(f"[{family}] trial {t.number} is leased to {owner or 'an agent'} until {when(lease)}: left to it")
                continue
            study._storage.set_trial_user_attr(t._trial_id, "reason", "interrupted")
            study._storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
            params = {k: v for k, v in t.params.items()}
            if not params:  # killed between ask and sampling: nothing to repeat, a fresh trial is the same
                self.log(f"[{family}] trial {t.number} was interrupted before its setting was sampled")
                continue
            # (killed while sampling: the sampled part is fixed, the rest is sampled again)
            study.enqueue_trial(params, user_attrs={"requeued_from": t.number, **_origin(t)}, skip_if_exists=False)
            self.log(f"[{family}] trial {t.number} was interrupted: re-queued")

    def _worker_device(self) -> str | None:
        """The device the trial actors run on (for device-dependent knob checks), when it is known."""
        device = (self.spec.worker or {}).get("device")
        return None if device in (None, "auto") else device

    @staticmethod
    def _counted(study: Any) -> int:
        """Trials that count against the budget: finished ones, not the interrupted."""
        import optuna

        done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL))
        return sum(1 for t in done if t.user_attrs.get("reason") != "interrupted")

    # ------------------------------------------------------------------ time budget (budget.minutes)
    def _final_bench_s(self) -> float:
        """About what the final bench costs: 2 x final_repeats generations of the baseline's length, + half
        for its warm-up and metrics."""
        return 2 * self.spec.final_repeats * (self.baseline_ms or 0.0) / 1000 * 1.5

    def _expected_combinations(self, fronts: list[list[dict[str, Any]]]) -> int:
        """The combinations the integrator will measure for these survivor fronts (single survivors are their
        trials, not measured again; a family's merges are candidates like its survivors, at most; a budgeted
        search measures ``integrator.trials``)."""
        sizes = [len(family_candidates(f, merge=self.spec.integrator_merge)) for f in fronts]
        every = math.prod(k + 1 for k in sizes) - 1
        measured = max(0, every - sum(len(f) for f in fronts))
        return measured if every <= self.spec.integrator_max_exhaustive else min(measured, self.spec.integrator_trials)

    def _spent_s(self) -> float:
        """Measuring time spent so far over every run of this campaign: the recorded trials' and combinations'
        wall times (a timeout counts its limit; the final bench is kept apart, as the reserve)."""
        total = 0.0
        for r in self._all_records():
            if r.get("phase") == "final":
                continue
            wall = (r.get("timing") or {}).get("wall_s") or r.get("wall_s")
            if wall is None and r.get("reason") == "timeout":
                wall = self.spec.trial_timeout_s
            total += float(wall or 0.0)
        return total

    def _per_evaluation_s(self) -> float:
        """One evaluation's expected wall time: the median of those recorded, else a paired trial's
        generations (2 x repeats + the warm-up) at the baseline's latency."""
        walls = self._recorded_walls()
        if walls:
            return float(statistics.median(walls))
        return (2 * int(self.spec.worker.get("repeats", 3)) + 1) * (self.baseline_ms or 0.0) / 1000 * 1.2

    def _evaluation_s_high(self, setting: dict[str, dict[str, Any]] | None = None) -> float:
        """An evaluation's wall time on the high side, for ``budget.run_minutes`` (a run cut mid-trial loses that
        trial's time): the upper quartile of the recorded evaluations that compiled nothing (else of all those
        recorded, else the estimate of ``_per_evaluation_s``). For a ``setting`` that compiles graphs no actor of
        this run has built, at least the longest recorded evaluation of a compiling setting: on the H200 a compile
        of the 19B and its VAE decoder took 336 s where the quartile said 139 s, and the call's limit cut that
        combination after 300 s of compiling. A compile's wall is not counted for the others: in h200-19b-1536e
        (a 57 s, a 10 s and a 246 s compiling trial recorded) the quartile of all three, 246 s, paused a call with
        118 s left before a trial that needed seconds; ``setting=None`` (before a sample is drawn) is estimated
        like a setting that compiles nothing, and the drawn setting is checked again with its own estimate."""
        records = self._measured_records()

        def compiles(r: dict[str, Any]) -> bool:
            return isinstance(r.get("knobs"), dict) and compile_signature(r["knobs"]) is not None

        walls = sorted(r["timing"]["wall_s"] for r in records if not compiles(r)) or \
            sorted(r["timing"]["wall_s"] for r in records)
        high = float(walls[math.ceil(0.75 * len(walls)) - 1]) if walls else self._per_evaluation_s()
        signature = compile_signature(setting) if setting else None
        if signature is not None and signature not in self.compiled_here:
            high = max([high, *(r["timing"]["wall_s"] for r in records if compiles(r))])
        return high

    def _measured_records(self) -> list[dict[str, Any]]:
        """The measured trials and combinations recorded so far, over every run (those with a wall time)."""
        return [r for r in self._all_records() if r.get("status") == "ok" and (r.get("timing") or {}).get("wall_s")]

    def _recorded_walls(self) -> list[float]:
        """The wall times of the measured trials and combinations recorded so far, over every run."""
        return [r["timing"]["wall_s"] for r in self._measured_records()]

    def _no_time_to_start(self, what: str, cost_s: float | None = None) -> bool:
        """``budget.run_minutes``: whether ``what``, of about ``cost_s`` (None: an evaluation's, on the high side),
        would end past this run's wall-time limit. Then nothing more is started (said once; the run pauses once
        what is in flight has ended)."""
        limit = self.spec.run_limit_s
        if limit is None:
            return False
        if cost_s is None:  # (read from the records only where a limit is set)
            cost_s = self._evaluation_s_high()
        left = self.started + limit - time.time()
        if cost_s <= left:
            return False
        if self.paused is None:
            self.log(f"run time: {what} (~{cost_s:.0f} s) would end past budget.run_minutes ({max(0.0, left):.0f} s "
                     f"left of {limit:.0f} s): nothing more is started; run the same command to go on from here")
            self.paused = what
        return True

    def _pause_if_out_of_run_time(self) -> None:
        """After a phase's dispatch loop: a run that stopped starting work for ``budget.run_minutes`` ends here
        (its records are whole; the next run goes on from them)."""
        if self.paused is not None:
            raise CampaignPaused(self.paused, self.spec.run_limit_s or 0.0)

    def _over_budget(self, in_flight: int, reserve_s: float) -> bool:
        """Whether starting one more evaluation (beside ``in_flight`` others) would leave less than ``reserve_s``
        of ``budget.minutes``."""
        if self.spec.time_budget_s is None:
            return False
        return self._spent_s() + (in_flight + 1) * self._per_evaluation_s() + reserve_s > self.spec.time_budget_s

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

    # ------------------------------------------------------------------ main loop
    def run(self) -> dict[str, Any]:
        """The whole campaign; returns a summary (also written to ``campaign.json``). A second run of the
        same campaign while this one lives raises ``CampaignBusy`` before it touches anything."""
        with campaign_lock(self.spec.directory), _StopOnSignals() as signals, _search_plan(self.spec):
            return self._run(signals)

    def _dispatch(self, pool: _Pool, source: Any, progress: Callable[[list[float]], None]) -> None:
        """The one dispatch loop, for the families' trials and the integrator's combinations alike: fill the
        free actors with ``source.next_job()`` (None: nothing to start now), collect what finishes, and
        hand each result to its job's ``done``. A job past ``trial_timeout_s`` is told a timeout failure
        and its actor replaced; an actor that died is recorded as such and replaced. Ends when nothing is
        in flight and the source has nothing to start."""
        ray = pool.ray
        in_flight: dict[Any, tuple[_Job, Any, float]] = {}  # ref -> (job, actor, started)
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
                    compiled[_actor_key(actor)] = signature
                    self.compiled_here.add(signature)
                in_flight[actor.evaluate.remote(job.setting, job.scoped)] = (job, actor, time.time())
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
                    result = {"status": "fail", "reason": "actor-died", "message": str(exc)[:500], "knobs": job.setting}
                    actor = pool.replace(actor)
                if now - t0 > self.spec.trial_timeout_s:  # finished, but past its time limit
                    result = {"status": "fail", "reason": "timeout", "knobs": job.setting,
                              "message": f"took {now - t0:.2f} s, limit {self.spec.trial_timeout_s} s"}
                job.done(result)
                durations.append(now - t0)
                free.append(actor)
                progress(durations)
            for ref, (job, actor, t0) in list(in_flight.items()):
                if now - t0 > self.spec.trial_timeout_s:
                    in_flight.pop(ref)
                    job.done({"status": "fail", "reason": "timeout", "knobs": job.setting,
                              "message": f"exceeded {self.spec.trial_timeout_s} s"})
                    free.append(pool.replace(actor))

    def _run(self, signals: _StopOnSignals | None = None) -> dict[str, Any]:
        check_resumed_quality(self.spec)  # a resumed campaign's quality numbers come from where they came from
        save_spec(self.spec)
        self._studies(check_only=True)  # a resumed campaign's search space still fits, before any model work
        pool = _Pool(self.spec)
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
            self._dispatch(pool, _FamilyTrials(self, studies),
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
    def _integrate(self, pool: _Pool, survivors: dict[str, list[dict]], baseline: dict[str, Any]) -> dict[str, Any]:
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
        done_before = [r for r in self._records("integrator") if r.get("combo") and r.get("phase") != "final"]
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
            log(f"integrator: {len(search.results)}/{search.total} combination(s) | ETA {eta:.0f} s (the final "
                f"bench {final_s:.0f} s of it), elapsed {time.time() - started_at:.0f} s")

        self._dispatch(pool, _Combinations(self, search), progress)
        self._pause_if_out_of_run_time()
        evaluated = search.evaluated()
        finals = {r["combo"]: r["result"] for r in self._records("integrator") if r.get("phase") == "final"}

        def bench(knobs: dict, out: str = "tuned") -> dict[str, Any]:
            key = combo_key(knobs)
            if key in finals:  # measured before a kill, or for another tier: not measured again
                log("integrator: the final bench of this setting was recorded already: reused")
                return finals[key]
            if self._no_time_to_start("the final bench", self._final_bench_s()):
                self._pause_if_out_of_run_time()
            log(f"integrator: final bench ({spec.final_repeats} interleaved repeats) of "
                f"{'the baseline against itself' if not knobs else knobs}")
            res = pool.get(pool.actors[0].bench.remote(knobs, spec.final_repeats, str(spec.directory / out)))
            self._append({"family": "integrator", "phase": "final", "combo": key, "knobs": knobs, "result": res,
                          "time": time.time()})
            finals[key] = res
            return res

        tiers = spec.tiers or ((None, spec.gate),)
        outcomes: dict[str | None, dict[str, Any]] = {}
        for tier, gate in tiers:
            label = f"tier {tier}: " if tier else ""
            # (a combination passing a tier's gate passes the search's, so its "faster" was measured)
            within = [{**e, "passes_gate": e["status"] == "ok" and gate.passes(e["quality"] or {})} for e in evaluated]
            chosen = choose(within)
            if not chosen:
                log(f"integrator: {label}no combination passes the gate and is faster than the baseline beyond the "
                    f"noise; the tuned config is the baseline (no techniques)")
            out = f"tuned-{tier}" if tier else "tuned"
            chosen, final, rejected = keep_if_faster(chosen, bench(chosen, out), lambda k, o=out: bench(k, o), log,
                                                     spec.integrator_max_p)
            what = f"{chosen}: x{final['speedup']:.3f} vs baseline, p={final['p_value']:.3g}" if chosen else (
                f"baseline (no techniques): x{final['speedup']:.3f} against itself (the measurement's noise)")
            log(f"tuned: {label}{what} (interleaved, {spec.final_repeats} repeats), PSNR "
                f"{final['quality']['psnr_db']:.2f} dB")
            path = export_tuned_config(spec, chosen, final, baseline, rejected=rejected, tier=(tier, gate) if tier else None)
            log(f"tuned config: {path}")
            outcomes[tier] = {"chosen": chosen, "final": final, "rejected": rejected, "tuned_config": str(path)}
        first = outcomes[tiers[0][0]]
        result = {"integrator": evaluated, **first}
        if spec.tiers:  # tuned.yaml: the strictest tier's (what a reader of one file should get: the safest)
            atomic_write_text(spec.directory / "tuned.yaml", Path(first["tuned_config"]).read_text())
            result["tiers"] = {t: {**o, "gate": asdict(g)} for (t, g), o in zip(tiers, outcomes.values())}
        return result

    def _measured_survivors(self, survivors: dict[str, list[dict]]) -> list[tuple[dict, dict[str, Any]]]:
        """Each survivor as a one-family combination with its trial's record (the same setting, measured the
        same way, paired with the same baseline): the integrator counts it as evaluated instead of measuring
        it again (at 1536x1024 on the 19B a measurement is about a minute)."""
        out = []
        for family, front in survivors.items():
            records = {r.get("trial"): r for r in self._records(family) if r.get("status") == "ok"}
            for s in front:
                rec = records.get(s["trial"])
                if rec is not None and rec.get("knobs") == s["knobs"]:
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
        """One line per finished trial: each family's count and best, and an ETA over what is left of the
        campaign: the families' trials, the integrator's combinations (as many as the survivors so far
        make, at most its budget) at the trials' mean duration, and the final bench (2 x final_repeats
        generations of about the baseline's length)."""
        parts, remaining, fronts = [], 0, []
        for family, study in studies.items():
            n = self._counted(study)
            remaining += max(0, self.spec.trials_per_family - n)
            best = self.survivors(study)
            fronts.append(best)
            best_txt = f"best {best[0]['total_ms']:.1f} ms @ {best[0]['psnr_db']:.1f} dB" if best else "no feasible yet"
            parts.append(f"{family} {n}/{self.spec.trials_per_family} ({best_txt})")
        if not durations:
            self.log(" | ".join(parts))
            return
        combos = self._expected_combinations(fronts)
        per = sum(durations) / len(durations)
        families_s = per * remaining / max(1, actors)
        integrator_s = per * combos / max(1, actors)
        final_s = self._final_bench_s()
        eta = families_s + integrator_s + final_s
        self.log(" | ".join(parts) + f" | ETA {eta:.0f} s (families {families_s:.0f}, integrator ~{combos} "
                 f"combination(s) {integrator_s:.0f}, final bench {final_s:.0f}), elapsed {time.time() - started:.0f} s")


