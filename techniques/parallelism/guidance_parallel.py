"""Guidance parallelism: the guidance passes of a multistep stage-1 step on separate ranks.

A guided step runs up to four transformer passes on the same latent (conditional, CFG-negative, STG,
modality) and combines them. The combination stays the official code (ltx_pipelines'
``multi_modal_guider_denoising_func``), recorded and replayed around the passes
(``techniques/guided_step.py``): pass i of the step is computed by rank i mod P from the recorded inputs;
once every rank has computed all of its passes, every rank receives every pass's prediction from its
owner, and the replayed step combines them exactly as the official one. Each pass is computed on the
same shapes as in one process, so the output is bit-identical.
"""

from __future__ import annotations

from typing import Any, Callable

from vidtune.techniques.parallelism.distributed import (
    broadcast_tensor,
    feasible_degrees,
    rank_group,
    require_world,
    suggest_with_feasible_degree,
    world_size,
)
from vidtune.techniques.guided_step import patch_guided_step
from vidtune.techniques.registry import Knob, KnobError, Patch, Technique, register

__all__ = ["GuidanceParallel"]


@register("parallelism.guidance_parallel")
class GuidanceParallel(Technique):
    """Up to four guidance passes per stage-1 step computed on separate ranks."""

    knobs = (Knob("degree", "categorical", off=1, choices=(1, 2, 4), help="ranks sharing a step's guidance passes (1: off)"),)
    switch = "degree"
    stages = ("stage1",)
    seams = ("parallel.ranks", "guidance.passes")
    apply_last = True
    description = "multistep stage-1 guidance passes (cond, CFG, STG, modality) on separate ranks"

    def applicable(self, request: Any = None) -> bool:
        return world_size() > 1 and (request is None or request.mode == "multistep")

    def neutral(self, request: Any, device: Any) -> dict[str, Any] | None:
        # each pass computed on the same shapes by one rank and exchanged: bit-identical (parallel_check)
        degrees = [d for d in feasible_degrees(self.knob("degree").choices) if d > 1]
        return {"degree": degrees[0]} if degrees and request.mode == "multistep" else None

    def suggest(self, trial: Any, request: Any = None) -> dict[str, Any]:
        return suggest_with_feasible_degree(self, trial)

    def check_request(self, values: dict[str, Any], request: Any) -> None:
        if values["degree"] > 1 and request.mode != "multistep":
            raise KnobError(f"{self.name}.degree={values['degree']} needs request.mode=multistep "
                            f"(a {request.mode} step runs one pass); got mode={request.mode!r}")
        if values["degree"] > 1:
            require_world(f"{self.name}.degree", values["degree"])

    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        rg = rank_group(f"{self.name}.degree", values["degree"])

        def compute(inputs: list, run_pass: Callable) -> list:
            # every rank computes all of its passes first, then the predictions are exchanged.
            # (Exchanging each pass right after its owner computed it serialised the ranks: the
            # others sat in that broadcast before starting their own pass. Measured on two H200s:
            # 1,620 ms alone, 1,602 ms on two ranks, results/benchmarks/parallel/.)
            mine = {i: run_pass(*inputs[i]) for i in range(rg.rank, len(inputs), rg.size)}
            outputs = []
            for i in range(len(inputs)):
                owner = i % rg.size
                dv, da = mine.pop(i) if owner == rg.rank else (None, None)
                outputs.append((broadcast_tensor(dv, owner, rg, pipeline.device),
                                broadcast_tensor(da, owner, rg, pipeline.device)))
            pipeline.records[self.name] = {"degree": rg.size, "passes_per_step": len(inputs),
                                           "passes_on_this_rank": sum(1 for i in range(len(inputs))
                                                                      if i % rg.size == rg.rank)}
            return outputs

        return patch_guided_step(self.name, pipeline, compute)
