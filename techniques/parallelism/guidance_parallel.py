"""Guidance parallelism: the guidance passes of a multistep stage-1 step on separate ranks.

A guided step runs up to four transformer passes on the same latent (conditional, CFG-negative, STG,
modality) and combines them. The combination stays the official code (ltx_pipelines'
``multi_modal_guider_denoising_func``); the technique runs each step twice around it:

1. record: the official step runs with a stand-in transformer that notes each pass's inputs and
   returns zeros (no model work; the combined result is thrown away);
2. pass i of the step is computed by rank i mod P from the recorded inputs; once every rank has
   computed all of its passes, every rank receives every pass's prediction from its owner;
3. replay: the official step runs again and the stand-in returns the exchanged predictions in order,
   so the guidance arithmetic is exactly the official one.

Each pass is computed on the same shapes as in one process, so the output is bit-identical. The
official function remembers the last prediction for guiders that skip steps; vidtune's guiders never
skip (``skip_step=0``), and the replay overwrites what the record run left.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from vidtune.techniques.parallelism._dist import (
    broadcast_tensor,
    feasible_degrees,
    rank_group,
    require_world,
    suggest_with_feasible_degree,
    world_size,
)
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
        patch = Patch(self.name)
        run_pass = pipeline.run_pass
        build = pipeline._guided_denoise_fn
        state: dict[str, Any] = {"mode": None, "inputs": [], "outputs": []}

        def routed_pass(name: str, video: Any, audio: Any, perturbations: Any) -> tuple[Any, Any]:
            if state["mode"] == "record":
                state["inputs"].append((name, video, audio, perturbations))
                return (None if video is None else torch.zeros_like(video.latent),
                        None if audio is None else torch.zeros_like(audio.latent))
            if state["mode"] == "replay":
                return state["outputs"].pop(0)
            return run_pass(name, video, audio, perturbations)

        def run_official(fn: Callable, mode: str, *args: Any) -> Any:
            state["mode"] = mode
            try:
                return fn(*args)
            finally:
                state["mode"] = None

        def guided_denoise_fn(request: Any, ctx: Any) -> Callable:
            fn = build(request, ctx)

            def step(video_state: Any, audio_state: Any, sigmas: Any, step_index: int) -> Any:
                state["inputs"] = []
                recorded = run_official(fn, "record", video_state, audio_state, sigmas, step_index)
                inputs = state["inputs"]
                if not inputs:  # a step that skipped every pass returned the remembered prediction
                    return recorded
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
                state["outputs"] = outputs
                result = run_official(fn, "replay", video_state, audio_state, sigmas, step_index)
                if state["outputs"]:
                    raise RuntimeError("guidance_parallel: the replayed step ran fewer passes than recorded")
                return result

            return step

        patch.set_attr(pipeline, "run_pass", routed_pass)
        patch.set_attr(pipeline, "_guided_denoise_fn", guided_denoise_fn)
        return patch
