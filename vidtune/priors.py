"""Where a campaign's new studies start: the catalogue's starting points for this GPU class and mode, the
knowledge base of earlier campaigns, and the settings known to lose (never measured)."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from vidtune.search.campaign import seed_params
from vidtune.search.catalogue import GpuClass, avoided, gpu_class, starting_points
from vidtune.search.knowledge import (Finding, earlier_compiles, earlier_findings, losers, losing_knobs, oom_settings,
                                      winners)

if TYPE_CHECKING:
    from vidtune.techniques.setting import Setting

__all__ = ["Priors"]


class Priors:
    """The priors of ``Campaign`` (a mixin: it reads the campaign's spec and logs through it)."""

    def gpu_class(self) -> GpuClass:
        """The class of the GPU the trials run on (the driver's view of the worker's device)."""
        import torch

        device = str(self.spec.worker.device if self.spec.worker is not None else "cpu")
        if device.startswith("cuda") and torch.cuda.is_available():
            index = int(device.split(":")[1]) if ":" in device else 0
            return gpu_class(torch.cuda.get_device_name(index))
        return GpuClass.CPU if device == "cpu" else GpuClass.OTHER_GPU

    def findings(self) -> list[Finding]:
        """What earlier campaigns of this model on this GPU class measured (the knowledge base), once per run."""
        if self._findings is None:
            from vidtune.search.quality_model import geometry

            here = geometry(self.spec.worker.source, self.spec.worker.request)
            self._findings = earlier_findings(self.spec.results_dir, self.spec.name, self._source(), self.gpu_class(), here) \
                if self.spec.knowledge else []
            found = self._findings
            if found:
                campaigns = sorted({f.origin.split(":")[0] for f in found})
                self.log(f"knowledge base: {len(found)} measured setting(s) of {len(campaigns)} earlier campaign(s) of "
                         f"this model on this GPU class ({', '.join(campaigns[:4])}{', ...' if len(campaigns) > 4 else ''}"
                         f"): {sum(f.won for f in found)} won, {sum(f.lost for f in found)} lost, "
                         f"{sum(f.oom for f in found)} ran out of memory")
        return self._findings

    def earlier_compiling(self) -> list[dict[str, Any]]:
        """The compiling evaluations of earlier campaigns of this model on this GPU class (knowledge base), once
        per run: the budget's price of a first compile before this campaign has recorded one."""
        if self._compiling is None:
            self._compiling = earlier_compiles(self.spec.results_dir, self.spec.name, self._source(), self.gpu_class()) \
                if self.spec.knowledge else []
        return self._compiling

    def _source(self) -> dict[str, Any]:
        """The model source as earlier campaigns' specs hold it (JSON)."""
        return json.loads(json.dumps(dataclasses.asdict(self.spec.worker.source)))

    def _queue_priors(self, study: Any, family: str) -> None:
        """A new family study's first trials: the catalogue's starting points for this GPU class and mode (exact
        before near-exact before approximate), then the best findings of earlier campaigns (knowledge base)."""
        from vidtune.model import GenerationRequest

        req = self.spec.worker.request
        queued: list[dict[str, Any]] = []
        candidates: list[tuple[str, Setting]] = []
        if self.spec.catalogue:
            candidates += [(f"catalogue {p.name} ({p.kind.name.lower()})", p.knobs)
                           for p in starting_points(self.gpu_class(), req.mode)]
        explicit = set(self.spec.warm_start or ())  # (those campaigns' best are queued by warm_start, after these)
        candidates += [(f"earlier campaign {f.origin} (x{1 / f.ratio:.3f})", f.knobs)
                       for f in winners([f for f in self.findings() if f.origin.split(":")[0] not in explicit], family)]
        for origin, knobs in candidates:
            params, _ = seed_params(family, knobs, req)
            if params is None or params in queued:
                continue
            study.enqueue_trial(params, user_attrs={"seeded_from": origin}, skip_if_exists=False)
            queued.append(params)
            self.log(f"[{family}] queued first: {origin}")

    def known_loser(self, setting: Setting) -> str | None:
        """Why ``setting`` is not worth measuring on this GPU class (None: it is): a catalogue loser, or a
        technique's setting an earlier campaign measured slower than its baseline alone."""
        from vidtune.techniques import get, resolve_values

        if self.spec.catalogue:
            rule = avoided(setting, self.gpu_class())
            if rule is not None:
                return f"{rule.technique}.{rule.knob}: {rule.why}"
        if self.spec.knowledge:
            oom = self._oom_findings()
            if oom:
                full = {name: get(name).validate(values) for name, values in resolve_values(setting).items()}
                for f in oom:
                    if {n: get(n).validate(v) for n, v in resolve_values(f.knobs).items()} == full:
                        return (f"ran out of memory in {f.origin} (a request of {f.pixels:,} pixels, this one "
                                f"{self.spec.worker.request.pixels:,}; a cap of {f.cap_gib} GiB)")
            lost, knobs = losers(self.findings()), losing_knobs(self.findings())
            for name, values in resolve_values(setting).items():
                full = get(name).validate(values)
                for other, origin in lost.get(name, ()):
                    if get(name).validate(other) == full:
                        return f"{name} {values} measured slower than the baseline in {origin}"
                for knob, value in full.items():
                    for other, origin in knobs.get((name, knob), ()):
                        if other == value:
                            return (f"{name}.{knob}={value} measured slower than the baseline in {origin} (alone; "
                                    f"the technique's knobs cost each on its own)")
        return None

    def _oom_findings(self) -> list[Finding]:
        """The earlier settings that ran out of memory where this campaign's trials would (search/knowledge.py)."""
        from vidtune.search.gpu_memory import memory_cap_gib, worker_budget

        w = self.spec.worker
        return oom_settings(self.findings(), w.request.pixels, w.request.mode,
                            memory_cap_gib(w.device, worker_budget(w)))
