"""Step skipping: a fixed mask of steps whose transformer pass reuses the previous prediction.

On a skipped step each pass (per guidance pass and tile) reuses the velocity it predicted at its last
computed step, re-applied to the current latent: x0 = x_t - sigma_t * v_prev. Reusing the velocity
rather than the x0 estimate keeps the step consistent with the current noise level.
"""

from __future__ import annotations

from typing import Any

import torch

from vidtune.techniques.caching._common import PassCounter, pass_key
from vidtune.techniques.registry import Knob, Patch, Technique, register

_STAGE_CHOICES = ("stage1", "stage2", "both")


def skip_mask(num_steps: int, every: int, first_kept: int, last_kept: int) -> list[bool]:
    """True for steps to skip: every ``every``-th step after the first kept ones, never the last kept."""
    if every <= 0:
        return [False] * num_steps
    mask = []
    for step in range(num_steps):
        inner = first_kept <= step < num_steps - last_kept
        mask.append(inner and (step - first_kept) % every == every - 1)
    return mask


def _velocity(latent: torch.Tensor, x0: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor | None:
    t = timesteps.float()
    if bool((t == 0).any()):
        return None  # a conditioned token: no velocity; fall back to computing the step
    return (latent.float() - x0.float()) / t


@register("caching.step_skip")
class StepSkip(Technique):
    """Reuse the previous step's prediction on a fixed mask of steps."""

    knobs = (
        Knob("every", "int", off=0, low=0, high=4, help="skip every k-th step between the kept ones (0: none)", fast="low"),
        Knob("first_kept", "int", off=1, low=1, high=8, help="first steps of a stage never skipped", fast="low"),
        Knob("last_kept", "int", off=1, low=1, high=4, help="last steps of a stage never skipped", fast="low"),
        Knob("stage", "categorical", off="stage1", choices=_STAGE_CHOICES, help="which denoising stage to skip in",
             fast="both"),
    )
    switch = "every"
    stages = ("stage1", "stage2")
    seams = ("transformer.pass",)
    description = "fixed step-skip mask reusing each pass's previous velocity"

    def neutral(self, request: Any, device: Any) -> dict[str, Any]:
        from vidtune.model.generation import stage_steps

        # the pass wrapper records every velocity, but the first kept steps cover the whole stage
        return {"every": 2, "first_kept": min(8, stage_steps(request)["stage1"]), "stage": "stage1"}

    def effective(self, values: dict[str, Any], request: Any) -> bool:
        from vidtune.model.generation import stage_steps

        steps = stage_steps(request)
        stages = ("stage1", "stage2") if values["stage"] == "both" else (values["stage"],)
        return any(any(skip_mask(steps[s], values["every"], values["first_kept"], values["last_kept"])[1:]) for s in stages)

    def cached_pass_cost(self, values: dict[str, Any], blocks: int) -> float | None:
        return 0.0  # (the carried velocity: a few element-wise operations)

    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        original = pipeline.transformer_pass
        last: dict[tuple, tuple] = {}
        counter = PassCounter(self.name)
        stages = ("stage1", "stage2") if values["stage"] == "both" else (values["stage"],)

        def skipped_steps(stage: str, num_steps: int) -> list[bool]:
            """The steps of ``stage`` this technique serves from a carried velocity (read by the guidance
            cache's ``refresh=computed``)."""
            if stage not in stages:
                return [False] * num_steps
            return skip_mask(num_steps, values["every"], values["first_kept"], values["last_kept"])

        def transformer_pass(video: Any, audio: Any, perturbations: Any) -> tuple[torch.Tensor, torch.Tensor]:
            key, step, num_steps = pass_key(pipeline)
            skip = skipped_steps(key[0], num_steps)[step]
            prev = last.get(key) if step > 0 else None
            if skip and prev is not None:
                counter.add(pipeline, key[0], cached=True)
                return tuple(
                    (m.latent.float() - v * m.timesteps.float()).to(m.latent.dtype)
                    for m, v in ((video, prev[0]), (audio, prev[1]))
                )
            dv, da = original(video, audio, perturbations)
            vv, va = _velocity(video.latent, dv, video.timesteps), _velocity(audio.latent, da, audio.timesteps)
            if vv is not None and va is not None:
                last[key] = (vv, va)
            else:
                last.pop(key, None)
            counter.add(pipeline, key[0], cached=False)
            return dv, da

        patch = Patch(self.name)
        patch.set_attr(pipeline, "transformer_pass", transformer_pass)
        patch.set_attr(pipeline, "vt_skipped_steps", skipped_steps)
        return patch
