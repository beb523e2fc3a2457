"""ltx2-mini's training objectives: one step function per component (losses and what they log), the
flow-matching inputs, and guidance and trajectory distillation for the distilled pipeline."""

from __future__ import annotations

import math
import random
from typing import Any, Callable

import torch
import torch.nn.functional as F

from vidtune.model.mini.parts import TrainConfig, log_mel, to_device
from vidtune.model.mini.text_encoder import tokenize

__all__ = ["STEPS", "pixel_weights", "colour_range_ratio", "flow_inputs", "fit_audio", "distill_intervals",
           "substeps_for", "guided_trajectory_target", "distill_step"]


def _vae_step(mods: dict, batch: dict, cfg: TrainConfig, g: torch.Generator) -> tuple[torch.Tensor, dict]:
    x = batch["video"]
    if cfg.colour_cast:  # drawn from the step's generator: a resumed run draws the same casts
        shift = (torch.rand(x.shape[0], 3, 1, 1, 1, generator=g) * 2 - 1) * cfg.colour_cast
        x = (x + shift.to(x.device, x.dtype)).clamp(-1, 1)
    means = mods["video_encoder"](x)  # identity statistics during training: raw means
    z = means + 0.05 * torch.randn(means.shape, generator=g, device="cpu").to(means.device)
    rec = mods["video_decoder"](z)
    w = pixel_weights(x, cfg.colour_weight)

    def mean(t: torch.Tensor) -> torch.Tensor:  # the weighted mean (the plain mean when colour_weight is 0)
        return t.mean() if w is None else (w * t).mean() / w.mean()

    err = rec - x
    l1, mse = mean(err.abs()), mean(err.pow(2))
    psnr = 10 * math.log10(4.0 / max(float(F.mse_loss(rec.detach(), x)), 1e-12))  # range [-1, 1]: peak-to-peak 2
    loss = l1 + mse + 1e-4 * means.pow(2).mean()
    info = {"l1": float(l1.detach()), "psnr_db": psnr, "saturation": round(colour_range_ratio(rec.detach(), x), 4)}
    if cfg.chroma:  # colour: each pixel's deviation from its own grey level (see TrainConfig.chroma)
        chroma = mean(((rec - rec.mean(1, keepdim=True)) - (x - x.mean(1, keepdim=True))).abs())
        loss = loss + cfg.chroma * chroma
        info["chroma_l1"] = float(chroma.detach())
    return loss, info


def pixel_weights(x: torch.Tensor, colour_weight: float) -> torch.Tensor | None:
    """``TrainConfig.colour_weight``'s per-pixel weights [B, 1, F, H, W] for clips [B, 3, F, H, W] (None: off)."""
    if not colour_weight:
        return None
    return 1 + colour_weight * (x.amax(1, keepdim=True) - x.amin(1, keepdim=True))


def colour_range_ratio(rec: torch.Tensor, x: torch.Tensor) -> float:
    """Mean per-pixel RGB range of a reconstruction over the clip's ([B, 3, F, H, W], any common
    scale): 0 for a grey decoder, ~1 when the colours come back."""
    def sat(t: torch.Tensor) -> torch.Tensor:
        return (t.amax(1) - t.amin(1)).float().mean()
    return float(sat(rec) / sat(x).clamp_min(1e-6))


def _audio_vae_step(mods: dict, batch: dict, cfg: TrainConfig, g: torch.Generator) -> tuple[torch.Tensor, dict]:
    mel = log_mel(batch["audio"], mods["processor"])
    lat = mods["audio_encoder"](mel)
    rec = mods["audio_decoder"](lat + 0.05 * torch.randn(lat.shape, generator=g).to(lat.device))
    t = min(rec.shape[2], mel.shape[2])
    loss = F.l1_loss(rec[:, :, :t], mel[:, :, :t])
    return loss + 1e-4 * lat.pow(2).mean(), {"mel_l1": float(loss.detach())}


def _stft_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    with torch.autocast(pred.device.type, enabled=False):  # torch.stft has no bf16 kernels
        return _stft_loss_f32(pred.float(), target.float())


def _stft_loss_f32(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    total = pred.new_zeros(())
    for n_fft, hop in ((512, 128), (1024, 256), (2048, 512)):
        win = torch.hann_window(n_fft, device=pred.device)
        P = torch.stft(pred.reshape(-1, pred.shape[-1]), n_fft, hop, window=win, return_complex=True).abs()
        T = torch.stft(target.reshape(-1, target.shape[-1]), n_fft, hop, window=win, return_complex=True).abs()
        total = total + torch.linalg.norm(T - P) / torch.linalg.norm(T).clamp_min(1e-7)
        total = total + F.l1_loss(torch.log(P.clamp_min(1e-5)), torch.log(T.clamp_min(1e-5)))
    return total / 3


def _vocoder_step(mods: dict, batch: dict, cfg: TrainConfig, g: torch.Generator) -> tuple[torch.Tensor, dict]:
    mel = log_mel(batch["audio"], mods["processor"])
    wav = mods["vocoder"](mel)
    target = batch["audio24"]
    n = min(wav.shape[-1], target.shape[-1])
    loss = _stft_loss(wav[..., :n], target[..., :n])
    return loss, {"stft": float(loss.detach())}


def _upsampler_step(mods: dict, batch: dict, cfg: TrainConfig, g: torch.Generator) -> tuple[torch.Tensor, dict]:
    enc = mods["video_encoder"]
    with torch.no_grad():
        low = enc(batch["video_half"])
        high = enc(batch["video"])
    stats = enc.per_channel_statistics
    pred = stats.normalize(mods["upsampler"](stats.un_normalize(low)))
    loss = F.mse_loss(pred, high)
    return loss, {"mse": float(loss.detach()), "mse_nearest": float(F.mse_loss(
        F.interpolate(low, size=high.shape[2:], mode="nearest"), high).detach())}


def _schedule(stage: int) -> list[float]:
    """The stage's distilled sigma schedule, ending at 0 (ltx-pipelines' constants)."""
    from ltx_pipelines.utils.constants import DISTILLED_SIGMA_VALUES, STAGE_2_DISTILLED_SIGMA_VALUES

    return [float(s) for s in (DISTILLED_SIGMA_VALUES if stage == 1 else STAGE_2_DISTILLED_SIGMA_VALUES)]


def _stage_sigmas(stage: int) -> list[float]:
    return [s for s in _schedule(stage) if s > 0]


def flow_inputs(video_latent: torch.Tensor, audio_latent: torch.Tensor, fps: float, frames: int, height: int,
                width: int, sigma: torch.Tensor, g: torch.Generator) -> dict[str, Any]:
    """Noised, patchified latent states with positions, as the pipeline builds them (ltx-core tools)."""
    from ltx_core.tools import AudioLatentTools, VideoLatentTools
    from ltx_core.types import AudioLatentShape, VideoLatentShape, VideoPixelShape
    from ltx_pipelines.utils.types import PipelineComponents

    b, device = video_latent.shape[0], video_latent.device
    comps = PipelineComponents(dtype=torch.float32, device=device)
    shape = VideoPixelShape(batch=b, frames=frames, width=width, height=height, fps=fps)
    vtools = VideoLatentTools(comps.video_patchifier, VideoLatentShape.from_pixel_shape(
        shape=shape, latent_channels=comps.video_latent_channels, scale_factors=comps.video_scale_factors), fps)
    atools = AudioLatentTools(comps.audio_patchifier, AudioLatentShape.from_video_pixel_shape(shape))
    vstate = vtools.create_initial_state(device, torch.float32, initial_latent=video_latent)
    astate = atools.create_initial_state(device, torch.float32, initial_latent=fit_audio(audio_latent, atools.target_shape))
    out = {}
    for key, st in (("video", vstate), ("audio", astate)):
        x0 = st.latent
        eps = torch.randn(x0.shape, generator=g, device=g.device).to(device)  # drawn where ``g`` lives
        s = sigma.view(b, 1, 1)
        out[key] = {"state": st, "x0": x0, "eps": eps, "xs": (1 - s) * x0 + s * eps,
                    "timesteps": st.denoise_mask * s}
    return out


def fit_audio(latent: torch.Tensor, target_shape: Any) -> torch.Tensor:
    """Crop or edge-pad an encoded audio latent [B, C, T, M] to the frames the pipeline expects."""
    t = target_shape.frames
    if latent.shape[2] >= t:
        return latent[:, :, :t]
    return torch.cat([latent, latent[:, :, -1:].expand(-1, -1, t - latent.shape[2], -1)], dim=2)


def _batch_latents(mods: dict, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's video and audio latents, encoded once per rendered batch (cfg.reuse steps share them)."""
    if "_latents" not in batch:
        with torch.no_grad():
            batch["_latents"] = (mods["video_encoder"](batch["video"]),
                                 mods["audio_encoder"](log_mel(batch["audio"], mods["processor"])))
    return batch["_latents"]


def _modalities(inp: dict[str, Any], latents: tuple[torch.Tensor, ...], sigma: torch.Tensor,
                contexts: tuple[torch.Tensor, ...]) -> tuple[Any, ...]:
    """ltx-core's video and audio ``Modality`` inputs for ``latents`` at per-clip ``sigma`` [n], with the
    positions and denoise masks of ``flow_inputs``' states (repeated when n is a multiple of their batch)."""
    from ltx_core.model.transformer.modality import Modality

    n = sigma.shape[0]
    out = []
    for key, latent, context in zip(("video", "audio"), latents, contexts):
        st = inp[key]["state"]
        reps = n // st.latent.shape[0]

        def rep(t: torch.Tensor) -> torch.Tensor:
            return t if reps == 1 else t.repeat(reps, *[1] * (t.dim() - 1))

        out.append(Modality(latent=latent, sigma=sigma, timesteps=rep(st.denoise_mask) * sigma.view(n, 1, 1),
                            positions=rep(st.positions), context=context))
    return tuple(out)


def _transformer_step(mods: dict, batch: dict, cfg: TrainConfig, g: torch.Generator) -> tuple[torch.Tensor, dict]:
    from ltx_core.guidance.perturbations import BatchedPerturbationConfig

    stage = batch["stage"]
    video, h, w = batch["video"], batch["h"], batch["w"]
    vlat, alat = _batch_latents(mods, batch)
    b = video.shape[0]
    rng = random.Random(batch["step_seed"])
    table = _stage_sigmas(stage)
    sig = [rng.choice(table) if rng.random() < 0.7 else rng.uniform(0.02, 1.0) for _ in range(b)]
    sigma = to_device(torch.tensor(sig, dtype=torch.float32), video.device)
    inp = flow_inputs(vlat, alat, cfg.fps, cfg.frames, h, w, sigma, g)
    prompts = [p if rng.random() >= 0.1 else "" for p in batch["prompts"]]
    ids = to_device(torch.stack([tokenize(p, mods["text_encoder"].cfg.tokens) for p in prompts]), video.device)
    ctx = mods["text_encoder"](ids)
    vv, va = mods["transformer"](*_modalities(inp, (inp["video"]["xs"], inp["audio"]["xs"]), sigma, ctx),
                                 BatchedPerturbationConfig.empty(b))
    tv = inp["video"]["eps"] - inp["video"]["x0"]
    ta = inp["audio"]["eps"] - inp["audio"]["x0"]
    lv, la = F.mse_loss(vv.float(), tv), F.mse_loss(va.float(), ta)
    # tensors, read (a device sync) only when the loop logs them
    return lv + la, {"video_mse": lv.detach(), "audio_mse": la.detach(), "stage": stage}


def distill_intervals(stage: int) -> list[tuple[float, float]]:
    """The (s_hi, s_lo) intervals of a stage's distilled schedule: the steps the distilled pipeline takes."""
    values = _schedule(stage)
    return list(zip(values[:-1], values[1:]))


def substeps_for(s_hi: float, s_lo: float, max_step: float) -> int:
    """The teacher's Euler substeps over (s_hi, s_lo): none longer than ``max_step``."""
    return max(1, math.ceil((s_hi - s_lo) / max_step - 1e-9))


Tensors = tuple[torch.Tensor, ...]  # one per modality (video, audio)


def guided_trajectory_target(predict: Callable[[Tensors, float], tuple[Tensors, Tensors]],
                             x: Tensors, s_hi: float, s_lo: float, substeps: int, cfg: tuple[float, ...] | float,
                             rescale: float = 0.7) -> Tensors:
    """The velocity v* = (x - x_lo) / (s_hi - s_lo) for which one Euler step from ``s_hi`` lands where
    ``substeps`` guided Euler steps of the teacher land at ``s_lo``.

    ``x``: the noised latents at ``s_hi`` (one tensor per modality, [B, T, C]); ``predict(x, sigma)``
    returns the teacher's (conditional, unconditional) velocities for them. Guidance is ltx-core's
    ``MultiModalGuider`` (CFG ``cfg``, one scale per modality or one for all, and guidance rescale) on
    the denoised predictions x - sigma * v, clip by clip, as the multistep pipeline applies it to its batch
    of one; the Euler step is ltx-core's (x + (s_next - s) * (x - denoised) / s).
    """
    from ltx_core.components.guiders import MultiModalGuider, MultiModalGuiderParams

    scales = cfg if isinstance(cfg, tuple) else (cfg,) * len(x)
    guiders = [MultiModalGuider(MultiModalGuiderParams(cfg_scale=c, rescale_scale=rescale)) for c in scales]
    grid = [s_hi + (s_lo - s_hi) * j / substeps for j in range(substeps + 1)]
    cur = tuple(x)
    for a, b in zip(grid, grid[1:]):
        cond, uncond = predict(cur, a)
        nxt = []
        for xi, vc, vu, guider in zip(cur, cond, uncond, guiders):
            dc, du = xi - a * vc.to(xi.dtype), xi - a * vu.to(xi.dtype)
            denoised = torch.stack([guider.calculate(dc[i], du[i], 0.0, 0.0) for i in range(xi.shape[0])])
            nxt.append(xi + (b - a) * (xi - denoised) / a)
        cur = tuple(nxt)
    return tuple((xi - xl) / (s_hi - s_lo) for xi, xl in zip(x, cur))


def distill_step(mods: dict, batch: dict, cfg: TrainConfig, g: torch.Generator) -> tuple[torch.Tensor, dict]:
    """``TrainConfig.distill_cfg``: the student's velocity at s_hi against the guided teacher's trajectory."""
    from ltx_core.guidance.perturbations import BatchedPerturbationConfig

    stage, video, h, w = batch["stage"], batch["video"], batch["h"], batch["w"]
    vlat, alat = _batch_latents(mods, batch)
    b = video.shape[0]
    rng = random.Random(batch["step_seed"])
    s_hi, s_lo = rng.choice(distill_intervals(stage))
    sigma = torch.full((b,), s_hi, device=video.device)
    inp = flow_inputs(vlat, alat, cfg.fps, cfg.frames, h, w, sigma, g)
    keep = [rng.random() >= 0.1 for _ in range(b)]  # prompt dropout, as in flow-matching training
    prompts = batch["prompts"]
    tokens = mods["text_encoder"].cfg.tokens
    ids = to_device(torch.stack([tokenize(p if k else "", tokens) for p, k in zip(prompts, keep)]), video.device)
    keys = ("video", "audio")

    with torch.no_grad():  # the teacher: conditional and unconditional in one batch of 2B
        both = torch.stack([tokenize(p, tokens) for p in prompts] + [tokenize("", tokens)] * b)
        both = to_device(both, video.device)
        t_ctx = mods["teacher_text"](both)

        def predict(x: Tensors, s: float) -> tuple[Tensors, Tensors]:
            out = mods["teacher"](*_modalities(inp, tuple(torch.cat([xi, xi]) for xi in x),
                                               torch.full((2 * b,), s, device=video.device), t_ctx),
                                  BatchedPerturbationConfig.empty(2 * b))
            return tuple(o[:b].float() for o in out), tuple(o[b:].float() for o in out)

        k = substeps_for(s_hi, s_lo, cfg.distill_max_step)
        target = guided_trajectory_target(predict, (inp["video"]["xs"], inp["audio"]["xs"]), s_hi, s_lo, k,
                                          cfg.distill_cfg)
    mask = torch.tensor(keep, device=video.device).view(b, 1, 1)
    targets = [torch.where(mask, t, inp[key]["eps"] - inp[key]["x0"]) for t, key in zip(target, keys)]
    ctx = mods["text_encoder"](ids)
    vv, va = mods["transformer"](*_modalities(inp, (inp["video"]["xs"], inp["audio"]["xs"]), sigma, ctx),
                                 BatchedPerturbationConfig.empty(b))
    lv, la = F.mse_loss(vv.float(), targets[0]), F.mse_loss(va.float(), targets[1])
    return lv + la, {"video_mse": lv.detach(), "audio_mse": la.detach(), "stage": stage, "s_hi": s_hi,
                     "substeps": k}




STEPS: dict[str, Callable] = {"video_vae": _vae_step, "audio_vae": _audio_vae_step, "vocoder": _vocoder_step,
                               "upsampler": _upsampler_step, "transformer": _transformer_step}
