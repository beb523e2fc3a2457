"""The campaign's final bench: each tier's chosen setting re-measured in interleaved whole generations against
the baseline (alone, or the tiers' settings together against the same baseline runs), recorded as it finishes so
that a resumed campaign does not measure it again. A bench that fails (it ran out of memory) is recorded as
failed, its actor replaced, and its setting loses to the baseline (``keep_if_faster``); the campaign goes on."""

from __future__ import annotations

import time
from typing import Any

from vidtune.integrator.combine import combo_key
from vidtune.pool import ActorPool
from vidtune.search.records import Status, failure_reason

__all__ = ["FinalBench"]


class FinalBench:
    """The final bench of ``Campaign`` (a mixin: ``spec``, ``log``, ``_append`` and the budget's methods)."""

    def _bench_on_pool(self, pool: ActorPool, knobs: Any, out: str, **others: Any) -> dict[str, Any]:
        """``TrialWorker.bench`` on the first actor; a failure comes back as a record (status fail, reason), the
        actor replaced (a bench that ran out of memory may leave its process full). The baseline against itself
        must be measurable: its failure is raised. Only Ray's errors (the bench raised in the actor, or the actor
        died) are failures of the bench: a stop signal (``CampaignStopped`` from the pool's polls) goes on up."""
        try:
            return pool.get(pool.actors[0].bench.remote(knobs, self.spec.final_repeats, str(self.spec.directory / out),
                                                        **others))
        except pool.ray.exceptions.RayError as exc:
            if not knobs:
                raise
            kind, message = failure_reason(getattr(exc, "cause", None) or exc)
            self.log(f"integrator: the final bench of {knobs} failed ({kind}: {message}); its actor is replaced")
            pool.replace(pool.actors[0])
            return {"status": Status.FAIL, "reason": kind, "message": message}

    def _final_bench(self, pool: ActorPool, finals: dict[str, Any], knobs: Any, out: str = "tuned") -> dict[str, Any]:
        """``knobs``' final bench, from ``finals`` (combo key -> result: recorded before a kill, or for another tier)
        or measured and recorded."""
        key = combo_key(knobs)
        if key in finals:
            self.log("integrator: the final bench of this setting was recorded already: reused")
            return finals[key]
        if self._no_time_to_start("the final bench", self._final_bench_s(1)):
            self._pause_if_out_of_run_time()
        self.log(f"integrator: final bench ({self.spec.final_repeats} interleaved repeats) of "
                 f"{'the baseline against itself' if not knobs else knobs}")
        res = self._bench_on_pool(pool, knobs, out)
        self._append({"family": "integrator", "phase": "final", "combo": key, "knobs": knobs, "result": res,
                      "time": time.time()})
        finals[key] = res
        return res

    def _bench_together(self, choices: dict[str | None, Any], finals: dict[str, Any], pool: ActorPool) -> None:
        """The tiers' chosen settings not benched yet, two or more, in one bench alternated with the same baseline runs
        (A B C ..., ... C B A: three tiers at 1536x1024x121 save ~10 baseline generations of ~12 s); each result is
        recorded as that setting's final bench. If it fails, nothing is recorded: each is benched alone after."""
        keys: dict[str, tuple[Any, str]] = {}  # combo key -> (setting, the first tier's folder)
        for tier, knobs in choices.items():
            key = combo_key(knobs)
            if knobs and key not in finals and key not in keys:
                keys[key] = (knobs, f"tuned-{tier}" if tier else "tuned")
        if len(keys) < 2:
            return
        (first, out), *rest = keys.values()
        if self._no_time_to_start("the final bench", self._final_bench_s(len(keys))):
            self._pause_if_out_of_run_time()
        names = {f"C{i}": (knobs, folder) for i, (knobs, folder) in enumerate(rest, 1)}
        self.log(f"integrator: final bench ({self.spec.final_repeats} interleaved repeats) of the tiers' {len(keys)} "
                 f"settings together: {first}; " + "; ".join(str(k) for k, _ in names.values()))
        res = self._bench_on_pool(pool, first, out, others={n: k for n, (k, _) in names.items()},
                                  out_dirs={n: str(self.spec.directory / folder) for n, (_, folder) in names.items()})
        if res.get("status") == Status.FAIL:
            return
        common = {k: v for k, v in res.items() if k != "others"}
        for knobs, result in [(first, common), *[(k, {**common, **{f: v for f, v in res["others"][n].items() if f != "knobs"}})
                                                 for n, (k, _) in names.items()]]:
            key = combo_key(knobs)
            result = {**result, "benched_with": [combo_key(k) for k, _ in keys.values() if combo_key(k) != key]}
            self._append({"family": "integrator", "phase": "final", "combo": key, "knobs": knobs, "result": result,
                          "time": time.time()})
            finals[key] = result
