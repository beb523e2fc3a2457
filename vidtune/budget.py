"""The campaign's time budgets (``budget.minutes`` over every run, ``budget.run_minutes`` for this run): what
an evaluation, the integrator and the final bench are expected to cost, read from the records so far."""

from __future__ import annotations

import math
import statistics
import time
from typing import TYPE_CHECKING, Any

from vidtune.integrator.combine import family_candidates
from vidtune.search.campaign import CampaignPaused
from vidtune.search.records import Reason, Status
from vidtune.techniques.setting import compile_signature, compiled_stages

if TYPE_CHECKING:
    from vidtune.techniques.setting import Setting

__all__ = ["TimeBudget", "FIRST_COMPILE_EVALUATIONS", "RESERVED_COMBINATIONS"]

# An evaluation that compiles graphs for the first time, in evaluations that do not, before any compile is recorded:
# measured 3.3x on an H100 (258 s against a median of 71-77 s, results/campaigns/h100-19b-1536f), 4.3x (246 s
# against 57 s) and 2.4x (336 s against 139 s) on an H200 (results/campaigns/h200-19b-1536e, h200-19b-1536)
FIRST_COMPILE_EVALUATIONS = 3.0

# The combinations the families keep budget for, at most. The integrator measures its combinations best-predicted
# first (``CombinationSearch._ordered``) and goes on while ``budget.minutes`` lasts, so its first two carry most of
# what it can add; reserving every expected one starved the families: in h100-19b-1536h (4 families, 18 minutes)
# the reserve for 15 combinations stopped them after 388 s and 5 trials, before kernel_choice's FP8 point ran.
RESERVED_COMBINATIONS = 2


class TimeBudget:
    """The budget estimates of ``Campaign`` (a mixin: it reads the campaign's spec, baseline and records)."""

    def _final_bench_s(self, settings: int | None = None) -> float:
        """About what the final bench costs: (1 + settings) x final_repeats generations of the baseline's length,
        + half for the warm-ups and metrics. ``settings``: those benched together (None: one per quality tier,
        the most the tiers' benches can hold)."""
        tiers = max(1, len(self.spec.tiers))
        bench = (1 + (tiers if settings is None else settings)) * self.spec.final_repeats * (self.baseline_ms or 0.0) / 1000
        return bench * 1.5 + (self._verdict_s(tiers) if settings is None else 0.0)

    def _verdict_s(self, tiers: int) -> float:
        """About what the tiers' verdicts cost (vidtune/verdicts.py): each tier's setting on each of the spec's other
        clips, a baseline and an evaluation there, each at the quality model's recorded time per trial (a trial's
        ``quality_model_s``; without one, this model's: the baseline's length); a tier's second candidate not
        counted."""
        clips = len(self.spec.verdict_clips)
        if not clips:
            return 0.0
        times = [t for r in self._all_records() if (t := (r.get("timing") or {}).get("quality_model_s"))]
        per = statistics.median(times) if times else (self.baseline_ms or 0.0) / 1000
        return tiers * clips * 2 * per

    def _expected_combinations(self, fronts: list[list[dict[str, Any]]]) -> int:
        """The combinations the integrator will measure for these survivor fronts (single survivors are their
        trials, not measured again; a family's merges are candidates like its survivors, at most; a budgeted
        search measures ``integrator.trials``)."""
        sizes = [len(family_candidates(f, merge=self.spec.integrator_merge)) for f in fronts]
        every = math.prod(k + 1 for k in sizes) - 1
        measured = max(0, every - sum(len(f) for f in fronts))
        return measured if every <= self.spec.integrator_max_exhaustive else min(measured, self.spec.integrator_trials)

    def _reserved_combinations(self, fronts: list[list[dict[str, Any]]]) -> int:
        """The combinations the families leave budget for: the expected ones, at most ``RESERVED_COMBINATIONS``
        (the integrator measures the most promising first and uses whatever the families leave beyond)."""
        return min(self._expected_combinations(fronts), RESERVED_COMBINATIONS)

    def _spent_s(self) -> float:
        """Measuring time spent so far over every run of this campaign: the recorded trials' and combinations'
        wall times (a timeout counts its limit; the final bench is kept apart, as the reserve)."""
        total = 0.0
        for r in self._all_records():
            if r.get("phase") == "final":
                continue
            wall = (r.get("timing") or {}).get("wall_s") or r.get("wall_s")
            if wall is None and r.get("reason") == Reason.TIMEOUT:
                wall = self.spec.trial_timeout_s
            total += float(wall or 0.0)
        return total

    def _per_evaluation_s(self) -> float:
        """One evaluation's expected wall time: the median of those recorded, else a paired trial's
        generations (2 x repeats + the warm-up) at the baseline's latency."""
        walls = self._recorded_walls()
        if walls:
            return float(statistics.median(walls))
        return (2 * int(self.spec.worker.repeats) + 1) * (self.baseline_ms or 0.0) / 1000 * 1.2

    def _evaluation_s_high(self, setting: Setting | None = None) -> float:
        """An evaluation's wall time on the high side, for ``budget.run_minutes`` (a run cut mid-trial loses that
        trial's time): the upper quartile of the recorded evaluations that compiled nothing (else of all those
        recorded, else the estimate of ``_per_evaluation_s``). For a ``setting`` that compiles graphs no actor of
        this run has built, that plus the recorded compile of each stage it compiles (``_compile_s``); before this
        campaign has recorded any compile, those of earlier campaigns of its model and GPU class (knowledge base,
        ``Priors.earlier_compiling``); where a stage it compiles has no compile recorded, at least the longest
        recorded evaluation of a compiling setting: on the H200 a compile
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
            by_stage = self._compile_s(setting, [r for r in records if compiles(r)])
            if by_stage is not None:
                return high + by_stage
            compiled = [r["timing"]["wall_s"] for r in records if compiles(r)]
            earlier = None if compiled else self._compile_s(setting, self.earlier_compiling())
            if earlier is not None:  # (no compile recorded here yet: those of earlier campaigns, stage by stage)
                return high + earlier
            # (none anywhere: FIRST_COMPILE_EVALUATIONS evaluations. The first compiling trial of h100-19b-1536f took
            # 258 s where the median said ~71 s, and used the integrator's share of budget.minutes)
            high = max([high, *compiled] if compiled else [high, FIRST_COMPILE_EVALUATIONS * self._per_evaluation_s()])
        return high

    @staticmethod
    def _compile_s(setting: Setting, compiling: list[dict[str, Any]]) -> float | None:
        """What compiling ``setting``'s graphs adds to an evaluation, stage by stage: for each stage it compiles
        (``compiled_stages``), the most a recorded evaluation that compiled that stage spent on its first run of
        it beyond the stage's timed median, x1.5 (the same stage's compile varies with what is traced: stage 2's first
        run took 10 s beyond warm with compile alone and 13 s with FP8 too, on the H100 at 1536x1024x121); None where a
        stage it compiles has no such record. Why by stage: in h100-19b-1536i the longest compiling trial, 341 s,
        was 226 s of the VAE decoder's first compiled run, and the FP8 setting that compiles only the transformer
        (~31 s beyond warm, measured after) was budgeted at 341 s and never started."""
        total = 0.0
        for stage in compiled_stages(setting):
            excess = [(r["timing"]["first_run_ms"][stage] - r["latency"][stage]["median_ms"]) / 1000
                      for r in compiling if stage in compiled_stages(r["knobs"])
                      and stage in (r["timing"].get("first_run_ms") or {}) and stage in (r.get("latency") or {})]
            if not excess:
                return None
            total += 1.5 * max(0.0, *excess)
        return total

    def _measured_records(self) -> list[dict[str, Any]]:
        """The measured trials and combinations recorded so far, over every run (those with a wall time); one the
        screen stopped before its timed runs is left out: it says little of what a setting that passes costs."""
        return [r for r in self._all_records() if r.get("status") == Status.OK and (r.get("timing") or {}).get("wall_s")
                and not r.get("screened")]

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

    def _over_budget(self, in_flight: int, reserve_s: float, cost_s: float | None = None) -> bool:
        """Whether starting one more evaluation (beside ``in_flight`` others; of ``cost_s``, default a median one)
        would leave less than ``reserve_s`` of ``budget.minutes``."""
        if self.spec.time_budget_s is None:
            return False
        per = self._per_evaluation_s()
        return self._spent_s() + in_flight * per + (per if cost_s is None else cost_s) + reserve_s > self.spec.time_budget_s
