"""Guidance cache: on chosen steps the guidance passes are not run; the guider gets the conditional pass of
the step minus the last computed difference (the idea of FasterCache's CFG cache and FastVideo's CFG gating).

A guided stage-1 step (``request.mode=multistep``) runs the conditional pass, then up to three guidance
passes on the same latent: ``uncond`` (the negative prompt, for CFG), ``stg`` (self-attention skipped in the
STG blocks) and ``modality`` (the audio-video cross-attention skipped). ltx-core's guider combines them as
``cond + (cfg - 1)(cond - uncond) + stg (cond - stg) + (modality - 1)(cond - modality)``. Over the later steps
the differences ``cond - pass`` change slowly, while each pass costs a whole transformer evaluation. So, per
(stage, pass, stage-2 tile), from step ``start`` on, a pass is computed every ``interval`` steps and the steps
in between return:
- ``reuse``: ``cond_now - (cond - pass)`` of its last computed step (the guidance term carried over);
- ``drop``: ``cond_now`` (that guidance term is 0 on the step: late-step guidance skipping).
With ``caching.step_skip`` on the same stage, ``refresh=computed`` (``reuse`` only) makes the steps it skips
reuse the guidance passes too, and moves a refresh that falls on one to the next step that runs; ``scheduled``
(the default) computes the passes there, which step skipping serves from their own last computed velocity.
The last ``last_kept`` steps are always computed. The conditional pass always runs. The state is cleared at a
stage's step 0, and nothing is read back to the host.

``split=fft`` (FasterCache's frequency treatment of the reused difference, reimplemented from the paper's idea):
the video difference stored at a computed step is cut, per latent frame, by a 2-D FFT over the latent grid
into the frequencies within ``cutoff`` of the spatial Nyquist radius (low) and the rest (high). On a reused step
of the stage's first half the low part is scaled by ``low_gain``, on the second half the high part by
``high_gain`` (early steps settle the layout, which the low frequencies carry; late steps the detail). At gains
of 1 the two parts add back to the difference up to float32 FFT rounding. The audio difference is reused whole
(it has no spatial grid), and so is the video's where the pass's tokens are not the grid's (``StepContext.grid``).
"""

from __future__ import annotations

from typing import Any

import torch

from vidtune.techniques.caching._common import PassCounter
from vidtune.techniques.registry import Knob, KnobError, Patch, Technique, register

__all__ = ["GuidanceCache", "deferred_mask", "reuse_mask", "split_frequencies"]

_PASSES = {"all": ("uncond", "stg", "modality"), "uncond": ("uncond",), "stg": ("stg",), "modality": ("modality",),
           "stg+modality": ("stg", "modality")}


def reuse_mask(num_steps: int, start: int, interval: int, last_kept: int) -> list[bool]:
    """True for the steps whose chosen guidance passes are not computed: from ``start``, all but every
    ``interval``-th step (``start`` itself computed), never the last ``last_kept`` steps."""
    if interval <= 1:
        return [False] * num_steps
    return [start <= s < num_steps - last_kept and (s - start) % interval != 0 for s in range(num_steps)]


def deferred_mask(reuse: list[bool], skipped: list[bool]) -> list[bool]:
    """``reuse`` with ``refresh=computed``: on a step that step skipping serves from carried velocities
    (``skipped``) the guidance passes are reused too, and a refresh scheduled there is deferred to the next
    step that runs. (Without it, such a refresh takes its difference from the skipped step's carried
    velocities, the guidance pass's from its own last computed step: when every refresh falls on a skipped
    step, the guidance term stays the one of the last step before ``start``.)"""
    out, pending = list(reuse), False
    for s, (r, k) in enumerate(zip(reuse, skipped)):
        if k:
            pending = pending or not r
            out[s] = True
        elif pending:
            out[s], pending = False, False
    return out


def _guided_passes(request: Any) -> set[str]:
    """The guidance passes a request's guided steps run (ltx-core runs each only when its scale acts)."""
    import math

    out = set()
    if not (math.isclose(request.cfg_scale, 1.0) and math.isclose(request.audio_cfg_scale, 1.0)):
        out.add("uncond")
    if not math.isclose(request.stg_scale, 0.0):
        out.add("stg")
    if not math.isclose(request.modality_scale, 1.0):
        out.add("modality")
    return out


def split_frequencies(delta: torch.Tensor, grid: tuple[int, int, int] | None,
                      cutoff: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``delta`` [B, F*H*W, C] (video tokens of a latent grid (F, H, W)) as its low and high spatial frequencies,
    float32, each [B, F*H*W, C], summing to ``delta``: low keeps, per frame and channel, the 2-D FFT bins whose
    radius is within ``cutoff`` of the Nyquist radius (the bins (0.5, 0) and (0, 0.5) are at 1). None when the
    tokens are not the grid's (conditioning tokens, no grid)."""
    if grid is None or delta.dim() != 3:
        return None
    f, h, w = grid
    b, t, c = delta.shape
    if t != f * h * w:
        return None
    x = delta.float().reshape(b, f, h, w, c)
    fy = torch.fft.fftfreq(h, device=delta.device)
    fx = torch.fft.rfftfreq(w, device=delta.device)
    radius = torch.sqrt(fy[:, None] ** 2 + fx[None, :] ** 2) / 0.5
    mask = (radius <= cutoff).to(torch.float32)[None, None, :, :, None]
    low = torch.fft.irfft2(torch.fft.rfft2(x, dim=(2, 3)) * mask, s=(h, w), dim=(2, 3))
    return low.reshape(b, t, c), (x - low).reshape(b, t, c)


def _minus(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    return None if a is None or b is None else a - b


@register("caching.guidance_cache")
class GuidanceCache(Technique):
    """Skip the guidance passes of chosen stage-1 steps, reusing (or dropping) their last difference from
    the conditional pass."""

    knobs = (
        Knob("interval", "int", off=1, low=1, high=6, help="from start, compute the guidance passes every k-th step (1: every step, off)",
             fast="high"),
        Knob("start", "int", off=0, low=0, high=64, help="first step whose guidance passes may be skipped", fast="low"),
        Knob("passes", "categorical", off="all", choices=tuple(_PASSES), help="which guidance passes are skipped"),
        Knob("mode", "categorical", off="reuse", choices=("reuse", "drop"),
             help="reuse: carry the last difference from the conditional pass; drop: no guidance term on the step"),
        Knob("last_kept", "int", off=1, low=0, high=8, help="last steps of the stage whose passes are always computed",
             fast="low"),
        # "scheduled" is the behaviour before this knob existed, so configs recorded then reproduce
        Knob("refresh", "categorical", off="scheduled", choices=("scheduled", "computed"),
             help="with caching.step_skip: scheduled: a refresh on a skipped step takes the skipped step's carried "
                  "velocities; computed: passes on skipped steps are reused, a refresh there is deferred to the "
                  "next step that runs"),
        Knob("split", "categorical", off="none", choices=("none", "fft"),
             help="fft: the reused video difference cut into low and high spatial frequencies, scaled apart"),
        Knob("cutoff", "float", off=0.25, low=0.05, high=0.75, needs=("split", "fft"),
             help="low frequencies: within this fraction of the spatial Nyquist radius"),
        Knob("low_gain", "float", off=1.0, low=0.5, high=1.5, needs=("split", "fft"),
             help="scale of the low-frequency part on reused steps of the stage's first half"),
        Knob("high_gain", "float", off=1.0, low=0.5, high=1.5, needs=("split", "fft"),
             help="scale of the high-frequency part on reused steps of the stage's second half"),
    )
    switch = "interval"
    stages = ("stage1",)
    seams = ("guidance.passes",)
    # Applied after the batched passes so that it wraps their routing: in the batched step's record run a
    # pass it reuses never reaches the batch, and what it stores there (zeros) the replay overwrites.
    apply_last = True
    composes_with = {"kernel_choice.batched_guidance": "the cache wraps the batched step's pass routing (applied "
                                                       "after it): the passes it reuses are left out of the batch"}
    description = "guidance passes (CFG, STG, modality) skipped on chosen steps, their last difference reused"

    def applicable(self, request: Any = None) -> bool:
        return request is None or (request.mode == "multistep" and bool(_guided_passes(request)))

    def check_request(self, values: dict[str, Any], request: Any) -> None:
        if values["split"] != "none" and values["mode"] != "reuse":
            raise KnobError(f"{self.name}.split={values['split']!r} acts on the reused difference; "
                            f"{self.name}.mode={values['mode']!r} reuses none (allowed with it: split='none')")
        if values["refresh"] != "scheduled" and values["mode"] != "reuse":
            raise KnobError(f"{self.name}.refresh={values['refresh']!r} defers the refresh of a reused difference; "
                            f"{self.name}.mode={values['mode']!r} reuses none (allowed with it: refresh='scheduled')")
        if values["interval"] > 1 and request.mode != "multistep":
            raise KnobError(f"{self.name}.interval={values['interval']} needs request.mode=multistep (a "
                            f"{request.mode} step runs no guidance pass); got mode={request.mode!r}")

    def effective(self, values: dict[str, Any], request: Any) -> bool:
        from vidtune.model.generation import stage_steps

        if request.mode != "multistep" or not set(_PASSES[values["passes"]]) & _guided_passes(request):
            return False
        mask = reuse_mask(stage_steps(request)["stage1"], values["start"], values["interval"], values["last_kept"])
        return any(mask[1:])

    def neutral(self, request: Any, device: Any) -> dict[str, Any]:
        from vidtune.model.generation import stage_steps

        # installed and recording every difference, but starting after the last step: nothing reused
        return {"interval": 2, "start": min(64, stage_steps(request)["stage1"])}

    def suggest(self, trial: Any, request: Any = None) -> dict[str, Any]:
        """Starts within the request's stage-1 steps (a start past them would measure the baseline again)."""
        from vidtune.model.generation import stage_steps

        if request is None:
            return super().suggest(trial, request)
        n = stage_steps(request)["stage1"]
        out = {"interval": trial.suggest_int(f"{self.name}.interval", 2, int(self.knob("interval").high)),
               "start": trial.suggest_int(f"{self.name}.start", 1, max(1, min(64, n - 2)))}
        for k in ("passes", "mode"):
            out[k] = trial.suggest_categorical(f"{self.name}.{k}", list(self.knob(k).choices))
        out["last_kept"] = trial.suggest_int(f"{self.name}.last_kept", 0, max(0, min(3, n - 1)))
        if out["mode"] == "reuse":  # (the split and the deferred refresh act on a reused difference only)
            out["refresh"] = trial.suggest_categorical(f"{self.name}.refresh", list(self.knob("refresh").choices))
            out["split"] = trial.suggest_categorical(f"{self.name}.split", list(self.knob("split").choices))
            if out["split"] == "fft":
                for k in ("cutoff", "low_gain", "high_gain"):
                    knob = self.knob(k)
                    out[k] = trial.suggest_float(f"{self.name}.{k}", knob.low, knob.high)
        return out

    def cached_pass_cost(self, values: dict[str, Any], blocks: int) -> float | None:
        return 0.0  # (the stored guidance term, reused)

    def apply_active(self, pipeline: Any, values: dict[str, Any]) -> Patch:
        original = pipeline.run_pass
        chosen = _PASSES[values["passes"]]
        drop = values["mode"] == "drop"
        split = values["split"] == "fft" and not drop
        deferred = values["refresh"] == "computed" and not drop
        cond: dict[tuple, tuple] = {}  # (stage, tile) -> (step, video, audio) of the step's conditional pass
        delta: dict[tuple, tuple] = {}  # (stage, pass, tile) -> (cond - pass) video, audio at its last computed step
        counter = PassCounter(self.name)

        def run_pass(pass_name: str, video: Any, audio: Any, perturbations: Any) -> tuple[torch.Tensor, torch.Tensor]:
            ctx = pipeline.context
            if ctx is None:
                return original(pass_name, video, audio, perturbations)
            counted = getattr(pipeline, "guided_phase", None) != "record"  # (batched: each pass is seen twice)
            if ctx.step == 0 and pass_name == "cond":  # a stage starts (its first pass): nothing carries over
                for d in (cond, delta):
                    for k in [k for k in d if k[0] == ctx.stage]:
                        del d[k]
            if pass_name == "cond":
                out = original(pass_name, video, audio, perturbations)
                cond[(ctx.stage, ctx.tile)] = (ctx.step, out[0], out[1])
                return out
            if pass_name not in chosen:
                return original(pass_name, video, audio, perturbations)
            here = cond.get((ctx.stage, ctx.tile))
            key = (ctx.stage, pass_name, ctx.tile)
            mask = reuse_mask(ctx.num_steps, values["start"], values["interval"], values["last_kept"])
            skipped_steps = getattr(pipeline, "vt_skipped_steps", None)  # (caching.step_skip, when applied)
            if deferred and skipped_steps is not None:
                mask = deferred_mask(mask, skipped_steps(ctx.stage, ctx.num_steps))
            skip = mask[ctx.step]
            if skip and here is not None and here[0] == ctx.step and (drop or key in delta):
                if counted:
                    counter.add(pipeline, ctx.stage, cached=True)
                if drop:
                    return here[1], here[2]
                dv, da = delta[key]
                if isinstance(dv, tuple):  # (low, high): scaled apart on the stage's first or second half
                    early = ctx.step < ctx.num_steps / 2
                    gain_low, gain_high = (values["low_gain"], 1.0) if early else (1.0, values["high_gain"])
                    dv = (gain_low * dv[0] + gain_high * dv[1]).to(here[1].dtype)
                return _minus(here[1], dv), _minus(here[2], da)
            out = original(pass_name, video, audio, perturbations)
            if here is not None and here[0] == ctx.step:
                dv = _minus(here[1], out[0])
                if split and dv is not None:
                    dv = split_frequencies(dv, ctx.grid, values["cutoff"]) or dv
                delta[key] = (dv, _minus(here[2], out[1]))
            if counted:
                counter.add(pipeline, ctx.stage, cached=False)
            return out

        patch = Patch(self.name)
        patch.set_attr(pipeline, "run_pass", run_pass)
        return patch
