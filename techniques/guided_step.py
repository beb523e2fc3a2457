"""Record and replay of a guided step: the one seam through which a technique computes a multistep step's
guidance passes its own way (on several ranks, as one batch) while the guidance arithmetic stays ltx-core's.

``patch_guided_step(name, pipeline, compute)`` wraps the pipeline's guided denoising function so that each
step runs the official step twice around ``compute``:
1. record: the official step runs with a stand-in transformer that notes each pass's inputs
   ``(pass name, video, audio, perturbations)`` and returns zeros (no model work; the result is dropped);
2. ``compute(inputs)`` returns one ``(video, audio)`` prediction per recorded pass, in order;
3. replay: the official step runs again and the stand-in returns those predictions in order.
The official function remembers the last prediction for guiders that skip steps; vidtune's guiders never
skip (``skip_step=0``), and the replay overwrites what the record run left.

``pipeline.guided_phase`` says which run is going on ("record", "replay", None outside one): a technique
wrapping ``run_pass`` from outside (the guidance cache) sees every pass twice and counts only the replay.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from vidtune.techniques.registry import Patch

__all__ = ["patch_guided_step", "PassInputs"]

PassInputs = tuple[str, Any, Any, Any]  # (pass name, video Modality, audio Modality, perturbations)


def patch_guided_step(name: str, pipeline: Any,
                      compute: Callable[[list[PassInputs], Callable[..., tuple[Any, Any]]], list[tuple[Any, Any]]]) -> Patch:
    """Patch ``pipeline`` (its ``run_pass`` and ``_guided_denoise_fn``) so that ``compute(inputs, run_pass)``
    computes each guided step's passes; ``run_pass`` is the pipeline's own, for computing a pass."""
    patch = Patch(name)
    run_pass = pipeline.run_pass
    build = pipeline._guided_denoise_fn
    state: dict[str, Any] = {"mode": None, "inputs": [], "outputs": []}

    def routed_pass(pass_name: str, video: Any, audio: Any, perturbations: Any) -> tuple[Any, Any]:
        if state["mode"] == "record":
            state["inputs"].append((pass_name, video, audio, perturbations))
            return (None if video is None else torch.zeros_like(video.latent),
                    None if audio is None else torch.zeros_like(audio.latent))
        if state["mode"] == "replay":
            return state["outputs"].pop(0)
        return run_pass(pass_name, video, audio, perturbations)

    def run_official(fn: Callable, mode: str, *args: Any) -> Any:
        state["mode"] = pipeline.guided_phase = mode
        try:
            return fn(*args)
        finally:
            state["mode"] = pipeline.guided_phase = None

    def guided_denoise_fn(request: Any, ctx: Any) -> Callable:
        fn = build(request, ctx)

        def step(video_state: Any, audio_state: Any, sigmas: Any, step_index: int) -> Any:
            state["inputs"] = []
            recorded = run_official(fn, "record", video_state, audio_state, sigmas, step_index)
            inputs = state["inputs"]
            if not inputs:  # a step that skipped every pass returned the remembered prediction
                return recorded
            state["outputs"] = list(compute(inputs, run_pass))
            if len(state["outputs"]) != len(inputs):
                raise RuntimeError(f"{name}: {len(state['outputs'])} predictions for {len(inputs)} recorded passes")
            result = run_official(fn, "replay", video_state, audio_state, sigmas, step_index)
            if state["outputs"]:
                raise RuntimeError(f"{name}: the replayed step ran fewer passes than recorded")
            return result

        return step

    patch.set_attr(pipeline, "run_pass", routed_pass)
    patch.set_attr(pipeline, "_guided_denoise_fn", guided_denoise_fn)
    patch.set_attr(pipeline, "guided_phase", None)
    return patch
