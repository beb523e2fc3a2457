"""Batched guidance passes: a multistep step's conditional, CFG, STG and modality passes as one transformer
call with a batch of up to four, on one device.

The passes of a guided stage-1 step see the same latent tokens and differ only in their text context
(CFG's negative prompt) and their perturbations (STG skips self-attention in chosen blocks, the modality
pass the audio-video cross-attention). ltx-core's transformer takes a batch with one perturbation config
per element (``BatchedPerturbationConfig``: the skipped attention is masked to zero for that element), so
the passes can share every weight read and kernel launch. At half resolution (stage 1 of a 1536x1024 video
holds 6,144 video tokens) one pass leaves a large GPU underused; four stacked fill it better.

The step is recorded and replayed around the batch (``techniques/guided_step.py``), so the guidance
arithmetic stays ltx-core's. Passes whose inputs cannot stack (other token counts or context lengths) run
one by one. The batched arithmetic is the same per element; whether a kernel rounds a row the same way in a
batch of four as alone depends on the kernel, so the output is within a stated tolerance rather than
bit-identical (tests/test_kernel_choice.py).
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, Callable

import torch

from vidtune.techniques.guided_step import PassInputs, patch_guided_step
from vidtune.techniques.registry import Knob, KnobError, Patch, Technique, register

__all__ = ["BatchedGuidance", "stack_passes"]


def _stackable(a: Any, b: Any) -> bool:
    if (a is None) != (b is None):
        return False
    if a is None:
        return True
    if a.enabled != b.enabled or a.latent.shape != b.latent.shape or a.context.shape != b.context.shape:
        return False
    return all((getattr(a, f) is None) == (getattr(b, f) is None) for f in ("context_mask", "attention_mask"))


def _stack(mods: list[Any]) -> Any:
    if mods[0] is None:
        return None
    tensors = {}
    for f in fields(mods[0]):
        parts = [getattr(m, f.name) for m in mods]
        if isinstance(parts[0], torch.Tensor):  # (a 0-d sigma, one per element: a [B] vector in a batch)
            tensors[f.name] = torch.stack(parts) if parts[0].dim() == 0 else torch.cat(parts)
    return replace(mods[0], **tensors)


def stack_passes(inputs: list[PassInputs]) -> list[list[int]]:
    """Groups (indices into ``inputs``) of passes that can run as one batch: the same token and context
    shapes for video and audio, in recording order; a pass that fits no earlier group starts its own."""
    groups: list[list[int]] = []
    for i, (_, video, audio, _) in enumerate(inputs):
        for g in groups:
            _, v0, a0, _ = inputs[g[0]]
            if _stackable(v0, video) and _stackable(a0, audio):
                g.append(i)
                break
        else:
            groups.append([i])
    return groups


@register("kernel_choice.batched_guidance")
class BatchedGuidance(Technique):
    """Run each multistep step's guidance passes as one batch through the transformer."""

    knobs = (Knob("enabled", "bool", off=False, help="stack a guided step's passes into one transformer call"),)
    switch = "enabled"
    stages = ("stage1",)
    seams = ("guidance.passes",)
    description = "a multistep step's conditional and guidance passes as one batched transformer call"
    inexact = ("a kernel may round a row of a batch of four differently from the same row alone (GEMM blocking, "
               "attention tiling)")

    def applicable(self, request: Any = None) -> bool:
        return request is None or request.mode == "multistep"

    def check_request(self, values: dict[str, Any], request: Any) -> None:
        if values["enabled"] and request.mode != "multistep":
            raise KnobError(f"{self.name}.enabled=True needs request.mode=multistep (a {request.mode} step runs "
                            f"one pass); got mode={request.mode!r}")

    def effective(self, values: dict[str, Any], request: Any) -> bool:
        return request.mode == "multistep"

    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        from ltx_core.guidance.perturbations import BatchedPerturbationConfig, PerturbationConfig

        def compute(inputs: list[PassInputs], run_pass: Callable) -> list[tuple[Any, Any]]:
            outputs: list[Any] = [None] * len(inputs)
            groups = stack_passes(inputs)
            for group in groups:
                if len(group) == 1:
                    outputs[group[0]] = run_pass(*inputs[group[0]])
                    continue
                configs = []
                for i in group:
                    p = inputs[i][3]
                    configs += list(p.perturbations) if p is not None else [PerturbationConfig.empty()]
                video = _stack([inputs[i][1] for i in group])
                audio = _stack([inputs[i][2] for i in group])
                # the rows' pass names in the batch's: the residual caches keep each row's state under its
                # pass's name, and caching.stg_prefix finds the conditional and STG rows
                name = "batch:" + "+".join(inputs[i][0] for i in group)
                dv, da = run_pass(name, video, audio, BatchedPerturbationConfig(perturbations=configs))
                for j, i in enumerate(group):
                    outputs[i] = (None if dv is None else dv[j:j + 1], None if da is None else da[j:j + 1])
            pipeline.records[self.name] = {"passes_per_step": len(inputs), "calls_per_step": len(groups)}
            return outputs

        return patch_guided_step(self.name, pipeline, compute)
