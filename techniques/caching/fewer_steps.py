"""Fewer stage-1 steps of the multistep pipeline, optionally with the gradient-estimation sampler.

The guided multistep stage 1 runs ``request.steps`` (40) steps of LTX2Scheduler's schedule, 72% of a `balanced`
setting's time at 1536x1024x121 (results/benchmarks/multistep). ``fraction`` runs the same scheduler with that fraction of the steps (0.5: 20 of 40);
``sampler=gradient_estimation`` replaces the Euler update by the gradient-estimation one of ltx-pipelines
(``ltx_pipelines.utils.gradient_estimating_euler_denoising_loop``; Permenter & Yuan, "Interpreting and Improving
Diffusion Models from an Optimization Perspective"): the velocity a step moves along is the previous step's plus
``gamma`` times its change, ``v = v_prev + gamma * (v_now - v_prev)`` (the first step moves along its own), and the
last step (to sigma 0) returns the denoised sample itself. LTX-2's own pipelines suggest 20-30 steps with it
instead of 40 plain ones.

Stage 2 (the distilled refinement, 3 steps) is left alone. With every knob off the pipeline runs its own Euler
loop (bit-identical); with ``sampler=gradient_estimation`` stage 1 equals the official loop on the same passes
(tests/test_fewer_steps.py, on tiny).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from vidtune.techniques.knobs import Knob, KnobError
from vidtune.techniques.registry import Patch, Technique, register

__all__ = ["FewerSteps", "gradient_estimation_loop", "steps_for"]


def steps_for(fraction: float, steps: int) -> int:
    """Stage-1 steps at ``fraction`` of ``steps`` (rounded half up, at least 2: one step and the last to sigma 0)."""
    return max(2, min(steps, int(fraction * steps + 0.5)))


def gradient_estimation_loop(pipeline: Any, stage: str, denoise_fn: Callable, grid: Any, gamma: float) -> Callable:
    """A stage's sampler loop with the gradient-estimation update (the official loop's arithmetic), setting the
    pipeline's step context before each step as its own loop does."""
    from ltx_core.utils import to_denoised, to_velocity
    from ltx_pipelines.utils.helpers import post_process_latent

    def corrected(noisy: Any, denoised: Any, sigma: Any, previous: Any) -> tuple[Any, Any]:
        velocity = to_velocity(noisy, sigma, denoised)
        if previous is not None:
            denoised = to_denoised(noisy, gamma * (velocity - previous) + previous, sigma)
        return velocity, denoised

    def loop(sigmas: Any, video_state: Any, audio_state: Any, stepper: Any) -> tuple[Any, Any]:
        n = len(sigmas) - 1
        sigma_values = sigmas.detach().float().cpu().tolist()
        previous_video = previous_audio = None
        try:
            for step in range(n):
                pipeline.enter_step(stage, step, n, sigma_values[step], grid)
                video, audio = denoise_fn(video_state, audio_state, sigmas, step)
                video = post_process_latent(video, video_state.denoise_mask, video_state.clean_latent)
                audio = post_process_latent(audio, audio_state.denoise_mask, audio_state.clean_latent)
                if sigma_values[step + 1] == 0:
                    return replace(video_state, latent=video), replace(audio_state, latent=audio)
                previous_video, video = corrected(video_state.latent, video, sigmas[step], previous_video)
                previous_audio, audio = corrected(audio_state.latent, audio, sigmas[step], previous_audio)
                video_state = replace(video_state, latent=stepper.step(video_state.latent, video, sigmas, step))
                audio_state = replace(audio_state, latent=stepper.step(audio_state.latent, audio, sigmas, step))
            return video_state, audio_state
        finally:
            pipeline.context = None

    return loop


@register("caching.fewer_steps")
class FewerSteps(Technique):
    """Stage 1 of the multistep pipeline in fewer steps, optionally with the gradient-estimation sampler."""

    knobs = (
        Knob("fraction", "float", off=1.0, low=0.25, high=1.0, fast="low",
             help="stage-1 steps as a fraction of request.steps (rounded, at least 2), on LTX2Scheduler's schedule"),
        Knob("sampler", "categorical", off="euler", choices=("euler", "gradient_estimation"),
             help="stage 1's update: Euler (the pipeline's own), or gradient estimation (ltx-pipelines' sampler)"),
        Knob("gamma", "float", off=2.0, low=1.0, high=3.0, needs=("sampler", "gradient_estimation"),
             help="gradient-estimation coefficient: v_prev + gamma * (v_now - v_prev) (2: ltx-pipelines' default)"),
    )
    stages = ("stage1",)
    seams = ("stage1.schedule", "denoise.loop")
    description = "stage 1 of the multistep pipeline in fewer steps (LTX2Scheduler), optionally gradient-estimation"

    def applicable(self, request: Any = None) -> bool:
        return request is None or (request.mode == "multistep" and request.stage1_sigmas is None)

    def check_request(self, values: dict[str, Any], request: Any) -> None:
        if self.is_off(values):
            return
        if request.mode != "multistep":
            raise KnobError(f"{self.name} needs request.mode=multistep (the distilled stage 1 has its fixed 8 sigmas); "
                            f"got mode={request.mode!r}")
        if values["fraction"] != 1.0 and request.stage1_sigmas is not None:
            raise KnobError(f"{self.name}.fraction={values['fraction']} cannot apply: request.stage1_sigmas gives the "
                            f"schedule explicitly (allowed: fraction=1.0, or a request without stage1_sigmas)")

    def effective(self, values: dict[str, Any], request: Any) -> bool:
        if not self.applicable(request):
            return False
        return values["sampler"] != "euler" or steps_for(values["fraction"], request.steps) != request.steps

    def neutral(self, request: Any, device: Any) -> dict[str, Any] | None:
        # a fraction that rounds to the request's own steps: the patch installed, the schedule and the Euler loop the same
        return {"fraction": max(0.25, 1.0 - 0.4 / max(request.steps, 1))}

    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        patch = Patch(self.name)
        fraction, gamma = float(values["fraction"]), float(values["gamma"])
        schedule = pipeline.stage1_sigmas
        multistep = {"now": False}  # whether the stage 1 about to run is a multistep one (read by the loop below)

        def stage1_sigmas(request: Any) -> Any:
            multistep["now"] = request.mode == "multistep" and request.stage1_sigmas is None
            if multistep["now"] and fraction != 1.0:
                return schedule(replace(request, steps=steps_for(fraction, request.steps)))
            return schedule(request)

        patch.set_attr(pipeline, "stage1_sigmas", stage1_sigmas)
        if values["sampler"] == "gradient_estimation":
            own = pipeline._denoising_loop

            def denoising_loop(stage: str, denoise_fn: Callable, grid: Any = None) -> Callable:
                if stage != "stage1" or not multistep["now"]:  # (a distilled stage 1 keeps its own loop)
                    return own(stage, denoise_fn, grid)
                return gradient_estimation_loop(pipeline, stage, denoise_fn, grid, gamma)

            patch.set_attr(pipeline, "_denoising_loop", denoising_loop)
        return patch
