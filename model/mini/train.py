"""Train ``ltx2-mini``: every component of the two-stage pipeline, on procedural clips made on the fly.

    python -m vidtune.model.mini.train video_vae   --out runs/mini --steps 4000 --device cuda --time-budget 540
    python -m vidtune.model.mini.train audio_vae   --out runs/mini ...
    python -m vidtune.model.mini.train vocoder     --out runs/mini ...
    python -m vidtune.model.mini.train upsampler   --out runs/mini ...   (needs video_vae)
    python -m vidtune.model.mini.train transformer --out runs/mini ...   (needs video_vae, audio_vae; trains the text encoder too)
    python -m vidtune.model.mini.train export      --out runs/mini --to model/mini/weights
    python -m vidtune.model.mini.train import      --out runs/mini --to model/mini/weights  (continue later)

Every component is an ltx-core class built from the ``ltx2-mini`` preset's config (the text encoder is
vidtune's). Each run resumes from ``<out>/<component>.pt`` (weights, optimiser, step, data position,
log), saves every ``--save-every`` steps and when ``--time-budget`` seconds are spent, so training
can be spread over several short device calls. Objectives:

- video VAE: L1 + MSE reconstruction of clips in [-1, 1], Gaussian noise on the latent means (0.05)
  and a small L2 pull on them (the encoder's log-variance channel is not used). The per-channel
  latent statistics are measured after training (``stats``) so that latents are unit-scale for the
  transformer, as in LTX-2.
- audio VAE: L1 on the log-mel spectrogram (ltx-core's ``AudioProcessor``: 16 kHz, 64 bins, hop 160).
- vocoder: multi-resolution STFT loss (log magnitude L1 + spectral convergence) between the vocoder's
  24 kHz output from the true log-mel and the clip's 24 kHz audio.
- upsampler: MSE between upsample(latent of the half-resolution render) and the latent of the
  full-resolution render of the same scene (ltx-core's ``upsample_video`` normalisation).
- transformer + text encoder: flow matching (x_s = (1 - s) x0 + s eps, target eps - x0) on video and
  audio latents, stage 1 at half resolution with sigmas from the distilled stage-1 schedule and stage 2
  at full resolution with the stage-2 schedule (70%), uniform sigmas otherwise (30%); the prompt is
  dropped 10% of the time, so the multistep mode's CFG has an unconditional model.
- transformer with ``--distill-cfg W --teacher DIR``: guidance and trajectory distillation for the
  distilled pipeline (``TrainConfig.distill_cfg``): over each interval of the distilled schedules, the
  velocity that lands where the teacher's CFG-W Euler substeps land.

    python -m vidtune.model.mini.train teacher --to EXPORT --out DIR   (DIR/teacher.safetensors: a teacher)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from vidtune.model.mini.data import render_audio, render_video, sample_scene
from vidtune.model.mini.text_encoder import MiniTextEncoder, TextEncoderConfig, tokenize
from vidtune.model.weights import identity_latent_statistics

__all__ = ["TrainConfig", "COMPONENTS", "train", "export", "build", "clip_batch", "colour_range_ratio", "HELD_OUT_SEED"]

COMPONENTS = ("video_vae", "audio_vae", "vocoder", "upsampler", "transformer")
HELD_OUT_SEED = 1_000_000_000  # scenes with seeds at or above this are never trained on
PRESET = "ltx2-mini"
TEXT_WIDTH = 96
AUDIO_RATE = 16000  # the audio VAE's rate (mel input)
VOCODER_RATE = 24000


@dataclass
class TrainConfig:
    component: str
    out: str
    steps: int = 1000
    batch: int = 4
    lr: float = 3e-4
    device: str = "cpu"
    seed: int = 0
    time_budget_s: float = 0.0  # stop (and save) after this many seconds; 0: no limit
    save_every: int = 200
    log_every: int = 20
    height: int = 256  # full (stage-2) resolution; stage 1 and the upsampler's input use half
    width: int = 384
    frames: int = 17
    fps: float = 24.0
    crop: int = 0  # VAE training: random square crops of this size (0: whole frames)
    schedule_s: float = 0.0  # learning-rate schedule length in training seconds over all runs (0: by steps)
    amp: bool | None = None  # bf16 autocast (None: on CUDA only)
    # each rendered batch (and, for the transformer, its VAE latents) serves this many optimiser steps,
    # with fresh noise, sigmas and prompt dropout each step: the tiny models train faster than clips
    # are drawn and encoded (first H200 run: transformer 4 steps/s at batch 16)
    reuse: int = 1
    # video VAE: weight of an L1 loss on colour alone (pixel minus its grey level). The scenes are mostly
    # grey texture, so colour is a small part of the pixel loss: the first H200 VAE (2,312 steps) decoded
    # every clip in grey (output saturation 1.6/255 against 41 in the clip)
    chroma: float = 0.0
    # video VAE: train the decoder alone, the encoder frozen. The encoder defines the latent space the
    # upsampler and the transformer learn; every earlier call's phase A moved it under them (phase B then
    # trained the transformer on a new latent space). With the encoder fixed, the decoder can go on
    # learning (it decodes in grey so far) beside the transformer without undoing its training.
    freeze_encoder: int = 0
    # per-layer learning rate: a layer with fan-in F (inputs per output: in_channels x kernel volume)
    # trains at min(lr, lr_fan_in / F) (0: every layer at lr). AdamW moves every weight by about lr per
    # step whatever its gradient, and on smooth frames the gradients of a layer's taps agree, so a
    # 3x3x3 convolution over 128 channels (F = 3,456) moves its output by ~F x lr x input per step: at
    # lr 3e-4 the encoder destroyed the colour it had at initialisation within 50 steps
    # (results/mini/checks/video_vae_grey_4.md), at 3e-6 it kept and improved it.
    lr_fan_in: float = 0.0
    # video VAE: shift each training clip's R, G and B by their own U(-c, c) (clipped to [-1, 1]), so every
    # pixel carries colour and not only the few shapes on a grey background. On those scenes the decoder's
    # R, G and B output rows converge and it decodes grey (results/mini/checks/video_vae_grey_4.md)
    colour_cast: float = 0.0
    # video VAE: weight each pixel's loss (L1, MSE and the chroma term) by 1 + c x its RGB range in the clip
    # (max minus min over R, G, B), normalised by the mean weight. The saturated shapes cover a few percent
    # of the frame, so unweighted they barely count and every VAE tried decoded grey. On one H200, whole
    # 256x384x9 frames, fresh weights, 400 s: c = 10 kept the colour (colour kept 1.07, 25.1 dB held-out,
    # 2,375 steps) where c = 0 went grey (0.08, 21.8 dB); results/mini/checks/video_vae_grey_6.md
    colour_weight: float = 0.0
    # resume with the learning-rate schedule's clock at 0 and a fresh warm-up: one cosine per call, whether
    # the run was imported this call or is still on a held device machine. Without it, a second call on a
    # held machine continued the clock past its schedule and trained at the floor, 2% of the peak
    # (results/mini/training/call6, 2026-11-30)
    restart_schedule: int = 0
    # transformer: guidance and trajectory distillation (0: off, plain flow matching). The distilled pipeline
    # (8 + 3 passes, no guidance), which campaigns run, needs it: on the CPU, 6 held-out prompts, the fourth
    # checkpoint's prompted colours were present in 0.00 of its videos without guidance (distilled
    # schedule, or 40 steps), 0.50 with CFG 7 at 40 steps and 0.14 with CFG 7 at the 8 distilled sigmas
    # (results/mini/checks/guidance_diagnosis.log). So the student learns, at each interval (s_hi, s_lo) of
    # the distilled schedules, the velocity that lands where the teacher's guided Euler steps land:
    # v* = (x_hi - x_lo) / (s_hi - s_lo), the teacher taking ceil((s_hi - s_lo) / distill_max_step) substeps
    # with CFG ``distill_cfg`` (video and audio) and guidance rescale 0.7, as the multistep pipeline guides.
    # Prompt-dropped samples keep the flow-matching target (the unconditional model stays a plain one).
    distill_cfg: float = 0.0
    distill_max_step: float = 0.1
    # the teacher, undistilled: an export folder (model.safetensors + spatial_upsampler.safetensors), or a
    # folder holding teacher.safetensors (``train teacher``: its transformer and text encoder alone);
    # required when distill_cfg > 0
    teacher: str = ""


# ----------------------------------------------------------------------------- data
def clip_batch(seeds: list[int], frames: int, height: int, width: int, fps: float, device: Any,
               audio_rate: int | None = None, render_height: int | None = None,
               render_width: int | None = None) -> dict[str, Any]:
    """Clips of the scenes ``seeds``: video [B, 3, F, H, W] in [-1, 1], audio [B, 2, S], prompts.

    ``render_height/width`` set the frame the motion is computed in (bounces, shape sizes), so a
    half-resolution render shows the same scene as the full one.
    """
    rh, rw = render_height or height, render_width or width
    scenes = [sample_scene(s) for s in seeds]
    videos = []
    for sc in scenes:
        v = render_video(sc, frames, rh, rw, fps, device=device)
        if (rh, rw) != (height, width):
            v = F.interpolate(v.permute(0, 3, 1, 2), size=(height, width), mode="area").permute(0, 2, 3, 1)
        videos.append(v)
    video = torch.stack(videos).permute(0, 4, 1, 2, 3) * 2 - 1
    out = {"video": video, "prompts": [sc.prompt for sc in scenes], "scenes": scenes}
    if audio_rate:
        out["audio"] = torch.stack([render_audio(sc, frames / fps, rh, rw, audio_rate, device=device) for sc in scenes])
    return out


def _mel(audio: torch.Tensor, processor: Any) -> torch.Tensor:
    """Log-mel in float32 (outside autocast: the log of a bf16 filterbank product loses too much)."""
    from ltx_core.types import Audio

    with torch.autocast(audio.device.type, enabled=False):
        return processor.waveform_to_mel(Audio(waveform=audio.float(), sampling_rate=AUDIO_RATE)).float()


def _processor(device: Any) -> Any:
    from ltx_core.model.audio_vae.ops import AudioProcessor

    return AudioProcessor(target_sample_rate=AUDIO_RATE, mel_bins=64, mel_hop_length=160, n_fft=1024).to(device)


# ----------------------------------------------------------------------------- models
def build(component: str, device: Any) -> torch.nn.Module:
    """A fresh float32 module of the mini preset (seeded): an ltx-core class, or the text encoder."""
    from ltx_core.model.audio_vae import AudioEncoderConfigurator

    from vidtune.model.presets import get_preset
    from vidtune.model.weights import _configurators

    preset = get_preset(PRESET)
    torch.manual_seed(sum(map(ord, component)))  # same fresh weights for a component on every run
    if component == "text_encoder":
        tcfg = preset.config["transformer"]
        module = MiniTextEncoder(TextEncoderConfig(
            video_dim=tcfg["cross_attention_dim"], audio_dim=tcfg["audio_cross_attention_dim"], width=TEXT_WIDTH,
            tokens=preset.extra["context_tokens"]))
    elif component == "audio_encoder":
        module = AudioEncoderConfigurator.from_config(preset.config)
    elif component == "upsampler":
        module = _configurators()["upsampler"].from_config(preset.upsampler_config)
    else:
        module = _configurators()[component].from_config(preset.config)
    if component == "transformer":
        _init_transformer(module)
    identity_latent_statistics(module)  # training sees raw latents; the statistics are measured later
    return module.to(device).float()


@torch.no_grad()
def _init_transformer(model: torch.nn.Module) -> None:
    # ltx-core builds parameters with torch defaults; AdaLN tables start small so each block starts
    # near the identity, and the output projections start at zero (the first prediction is 0 velocity).
    for name, p in model.named_parameters():
        if "scale_shift_table" in name:
            p.normal_(std=0.02)
        elif name.startswith(("proj_out", "audio_proj_out")):
            p.zero_()


def _parts(component: str) -> tuple[str, ...]:
    return {"video_vae": ("video_encoder", "video_decoder"), "audio_vae": ("audio_encoder", "audio_decoder"),
            "vocoder": ("vocoder",), "upsampler": ("upsampler",),
            "transformer": ("transformer", "text_encoder")}[component]


def _load_frozen(out: Path, component: str, device: Any) -> dict[str, torch.nn.Module]:
    path = out / f"{component}.pt"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: train `{component}` first")
    state = torch.load(path, map_location="cpu", weights_only=False)
    mods = {}
    for part in _parts(component):
        m = build(part, device)
        m.load_state_dict(state["model"][part])
        mods[part] = m.eval().requires_grad_(False)
    return mods


# ----------------------------------------------------------------------------- losses per component
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
    mel = _mel(batch["audio"], mods["_processor"])
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
    mel = _mel(batch["audio"], mods["_processor"])
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
                                 mods["audio_encoder"](_mel(batch["audio"], mods["_processor"])))
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
    sigma = _to_device(torch.tensor(sig, dtype=torch.float32), video.device)
    inp = flow_inputs(vlat, alat, cfg.fps, cfg.frames, h, w, sigma, g)
    prompts = [p if rng.random() >= 0.1 else "" for p in batch["prompts"]]
    ids = _to_device(torch.stack([tokenize(p, mods["text_encoder"].cfg.tokens) for p in prompts]), video.device)
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


def _distill_step(mods: dict, batch: dict, cfg: TrainConfig, g: torch.Generator) -> tuple[torch.Tensor, dict]:
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
    ids = _to_device(torch.stack([tokenize(p if k else "", tokens) for p, k in zip(prompts, keep)]), video.device)
    keys = ("video", "audio")

    with torch.no_grad():  # the teacher: conditional and unconditional in one batch of 2B
        both = torch.stack([tokenize(p, tokens) for p in prompts] + [tokenize("", tokens)] * b)
        both = _to_device(both, video.device)
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


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor on ``device``; to a GPU from pinned memory without blocking, because a copy from
    pageable memory waits for the GPU's queue to drain and the step's launches then cannot run ahead."""
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


# ----------------------------------------------------------------------------- the loop
def _make_batch(cfg: TrainConfig, step: int, device: Any) -> dict[str, Any]:
    seeds = [(cfg.seed * 7_919 + step * cfg.batch + i) % HELD_OUT_SEED for i in range(cfg.batch)]
    c = cfg.component
    if c == "video_vae":
        batch = clip_batch(seeds, cfg.frames, cfg.height, cfg.width, cfg.fps, device)
        if cfg.crop:
            rng = random.Random(step)
            y = rng.randrange(0, cfg.height - cfg.crop + 1, 32)
            x = rng.randrange(0, cfg.width - cfg.crop + 1, 32)
            batch["video"] = batch["video"][..., y:y + cfg.crop, x:x + cfg.crop]
        return batch
    if c in ("audio_vae", "vocoder"):
        batch = clip_batch(seeds, cfg.frames, cfg.height, cfg.width, cfg.fps, device, audio_rate=AUDIO_RATE)
        if c == "vocoder":
            batch["audio24"] = torch.stack([render_audio(sc, cfg.frames / cfg.fps, cfg.height, cfg.width,
                                                         VOCODER_RATE, device=device) for sc in batch["scenes"]])
        return batch
    if c == "upsampler":
        full = clip_batch(seeds, cfg.frames, cfg.height, cfg.width, cfg.fps, device)
        half = clip_batch(seeds, cfg.frames, cfg.height // 2, cfg.width // 2, cfg.fps, device,
                          render_height=cfg.height, render_width=cfg.width)
        return {"video": full["video"], "video_half": half["video"]}
    stage = 1 if step % 2 == 0 else 2
    h, w = (cfg.height // 2, cfg.width // 2) if stage == 1 else (cfg.height, cfg.width)
    batch = clip_batch(seeds, cfg.frames, h, w, cfg.fps, device, audio_rate=AUDIO_RATE,
                       render_height=cfg.height, render_width=cfg.width)
    batch.update(stage=stage, h=h, w=w)
    return batch


_STEPS: dict[str, Callable] = {"video_vae": _vae_step, "audio_vae": _audio_vae_step, "vocoder": _vocoder_step,
                               "upsampler": _upsampler_step, "transformer": _transformer_step}


def param_groups(modules: list[torch.nn.Module], lr: float, lr_fan_in: float) -> list[dict[str, Any]]:
    """AdamW groups with an ``lr_scale`` each (see ``TrainConfig.lr_fan_in``): one group per layer whose
    weight has a fan-in when ``lr_fan_in`` > 0 (its bias goes with it), every other parameter at scale 1."""
    if lr_fan_in < 0:
        raise ValueError(f"lr_fan_in must be >= 0 (0: off), got {lr_fan_in}")
    groups: list[dict[str, Any]] = []
    rest: list[torch.nn.Parameter] = []
    for module in modules:
        for m in module.modules():
            own = [p for p in m.parameters(recurse=False) if p.requires_grad]
            w = getattr(m, "weight", None)
            if lr_fan_in > 0 and isinstance(m, (torch.nn.Conv3d, torch.nn.Conv2d, torch.nn.Conv1d, torch.nn.Linear)) \
                    and w is not None and w.requires_grad:
                groups.append({"params": own, "lr_scale": min(1.0, lr_fan_in / (w[0].numel() * lr))})
            else:
                rest.extend(own)
    if rest:
        groups.append({"params": rest, "lr_scale": 1.0})
    return groups


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Train (or resume) one component; returns the saved state's summary."""
    if cfg.component not in COMPONENTS:
        raise ValueError(f"component must be one of {list(COMPONENTS)}, got {cfg.component!r}")
    if cfg.reuse < 1:
        raise ValueError(f"reuse must be >= 1, got {cfg.reuse}")
    if cfg.chroma < 0:
        raise ValueError(f"chroma must be >= 0 (a loss weight), got {cfg.chroma}")
    if not 0 <= cfg.colour_cast <= 1 or (cfg.colour_cast and cfg.component != "video_vae"):
        raise ValueError(f"colour_cast must be in [0, 1], and above 0 only for video_vae; got {cfg.colour_cast} "
                         f"for {cfg.component}")
    if cfg.colour_weight < 0 or (cfg.colour_weight and cfg.component != "video_vae"):
        raise ValueError(f"colour_weight must be >= 0, and above 0 only for video_vae; got {cfg.colour_weight} "
                         f"for {cfg.component}")
    if cfg.freeze_encoder not in (0, 1) or (cfg.freeze_encoder and cfg.component != "video_vae"):
        raise ValueError(f"freeze_encoder must be 0 or 1, and 1 only for video_vae; got {cfg.freeze_encoder} "
                         f"for {cfg.component}")
    if cfg.distill_cfg < 0 or (cfg.distill_cfg and cfg.component != "transformer"):
        raise ValueError(f"distill_cfg must be >= 0 (0: off), and above 0 only for transformer; got "
                         f"{cfg.distill_cfg} for {cfg.component}")
    if cfg.distill_cfg and not cfg.distill_max_step > 0:
        raise ValueError(f"distill_max_step must be > 0, got {cfg.distill_max_step}")
    if cfg.distill_cfg and not cfg.teacher:
        raise ValueError("teacher: distill_cfg > 0 needs a teacher folder, an export or teacher.safetensors "
                         "(--teacher DIR)")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(cfg.device)
    teacher_info = _load_teacher(cfg.teacher, device) if cfg.distill_cfg else None
    path = out / f"{cfg.component}.pt"
    mods: dict[str, Any] = {p: build(p, device).train() for p in _parts(cfg.component)}
    if cfg.component in ("upsampler", "transformer"):
        mods.update({k: v for k, v in _load_frozen(out, "video_vae", device).items() if k == "video_encoder"})
        _apply_stats(mods["video_encoder"], out / "video_vae.pt")
    if cfg.component == "transformer":
        mods.update({k: v for k, v in _load_frozen(out, "audio_vae", device).items() if k == "audio_encoder"})
        _apply_stats(mods["audio_encoder"], out / "audio_vae.pt")
    mods["_processor"] = _processor(device)
    if teacher_info is not None:
        mods["teacher"], mods["teacher_text"] = teacher_info.pop("modules")
    frozen = ("video_encoder",) if cfg.freeze_encoder else ()
    trained_parts = [mods[part] for part in _parts(cfg.component) if part not in frozen]
    trainable = [p for m in trained_parts for p in m.parameters()]
    opt = torch.optim.AdamW(param_groups(trained_parts, cfg.lr, cfg.lr_fan_in), lr=cfg.lr, weight_decay=0.0,
                            betas=(0.9, 0.99))
    # seconds: trained since the last import (the schedule's clock); seconds_before: trained before it
    state: dict[str, Any] = {"step": 0, "log": [], "config": asdict(cfg), "seconds": 0.0, "seconds_before": 0.0}
    warm_from = 0
    if path.exists():
        saved = torch.load(path, map_location="cpu", weights_only=False)
        for part in _parts(cfg.component):
            mods[part].load_state_dict(saved["model"][part])
        same_params = saved.get("config", {}).get("freeze_encoder", 0) == cfg.freeze_encoder
        # the saved optimiser fits only the same parameter groups (lr_fan_in on or off changes them)
        same_groups = saved.get("opt") is not None and \
            [len(g["params"]) for g in saved["opt"]["param_groups"]] == [len(g["params"]) for g in opt.param_groups]
        if same_params and same_groups:  # an imported export has no optimiser state
            opt.load_state_dict(saved["opt"])
        else:  # a fresh optimiser (also when freeze_encoder changes the trained parameters) warms up again
            warm_from = saved["step"]
        state.update(step=saved["step"], log=saved["log"], seconds=saved.get("seconds", 0.0),
                     seconds_before=saved.get("seconds_before", 0.0))
        if "stats" in saved:
            state["stats"] = saved["stats"]
        if saved.get("distilled"):
            state["distilled"] = saved["distilled"]
        if cfg.restart_schedule:
            state["seconds_before"] += state["seconds"]
            state["seconds"] = 0.0
            warm_from = state["step"]
    if state.get("distilled") and not cfg.distill_cfg:
        raise ValueError(f"{path} holds a guidance-distilled transformer ({state['distilled']}): plain flow "
                         "matching would undo the distillation; continue with --distill-cfg and --teacher")
    if teacher_info is not None:  # the first distilled step and the teacher's provenance ride with the state
        state["distilled"] = {"cfg": cfg.distill_cfg, "max_step": cfg.distill_max_step, **teacher_info,
                              "from_step": state.get("distilled", {}).get("from_step", state["step"])}
    for part in frozen:  # after loading: the saved encoder is the one kept
        mods[part].eval().requires_grad_(False)
    # the transformer's flow-matching noise is drawn on the GPU when training there (no host draw and copy,
    # which waits for the GPU, every step); the other components and the CPU keep the CPU generator
    on_gpu_noise = cfg.component == "transformer" and device.type == "cuda"
    g = torch.Generator(device=device) if on_gpu_noise else torch.Generator()
    g.manual_seed(cfg.seed * 65_537 + state["step"])
    step_fn = _distill_step if cfg.distill_cfg else _STEPS[cfg.component]
    start = time.time()
    use_bf16 = device.type == "cuda" if cfg.amp is None else cfg.amp

    def save() -> None:
        state["seconds"] += time.time() - start_save[0]
        start_save[0] = time.time()
        blob = {"model": {p: mods[p].state_dict() for p in _parts(cfg.component)}, "opt": opt.state_dict(),
                "step": state["step"], "log": state["log"], "config": asdict(cfg), "seconds": state["seconds"],
                "seconds_before": state["seconds_before"]}
        if state.get("distilled"):
            blob["distilled"] = state["distilled"]
        if cfg.component in ("video_vae", "audio_vae"):
            blob["stats"] = _measure_stats(cfg, mods, device)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save(blob, tmp)
        os.replace(tmp, path)

    start_save = [time.time()]
    cached: list[Any] = [None, None]
    while state["step"] < cfg.steps:
        lr = cfg.lr * min(1.0, (state["step"] - warm_from + 1) / 100)  # warm-up
        progress = state["step"] / max(cfg.steps, 1)
        if cfg.schedule_s:  # on a time budget the schedule follows the seconds spent, summed over resumes
            progress = max(progress, (state["seconds"] + time.time() - start_save[0]) / cfg.schedule_s)
        lr *= 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))  # cosine to 2% of the peak
        for group in opt.param_groups:
            group["lr"] = max(lr, cfg.lr * 0.02) * group["lr_scale"]
        g.manual_seed(cfg.seed * 65_537 + state["step"])  # per-step noise: a resumed run continues exactly
        data_index = state["step"] // cfg.reuse  # resumes exactly: the batch is re-rendered from its index
        if cached[0] != data_index:
            cached[:] = [data_index, _make_batch(cfg, data_index, device)]
        batch = cached[1]
        batch["step_seed"] = cfg.seed * 1_000_003 + state["step"]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
            loss, info = step_fn(mods, batch, cfg, g)
        logging = (state["step"] + 1) % cfg.log_every == 0 or state["step"] + 1 == cfg.steps
        saving = (state["step"] + 1) % cfg.save_every == 0
        out_of_time = bool(cfg.time_budget_s) and time.time() - start > cfg.time_budget_s
        # reading the loss waits for the GPU: there it is checked when logging or saving (a non-finite loss
        # spreads to every later one, and nothing non-finite is saved), on the CPU every step
        if (device.type != "cuda" or logging or saving or out_of_time) and not torch.isfinite(loss):
            raise FloatingPointError(f"{cfg.component}: loss is {float(loss.detach())} at step {state['step']}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        state["step"] += 1
        if logging:
            state["log"].append({"step": state["step"], "loss": float(loss.detach()),
                                 **{k: float(v) if torch.is_tensor(v) else v for k, v in info.items()},
                                 "elapsed_s": round(state["seconds"] + time.time() - start_save[0], 1)})
            print(json.dumps(state["log"][-1]), flush=True)
        if saving:
            save()
        if out_of_time:
            break
    save()
    return {"component": cfg.component, "step": state["step"], "last": state["log"][-1] if state["log"] else None}


def _export_models(folder: Path, dtype: torch.dtype) -> Any:
    """Every component of an export folder, loaded on the CPU through the checkpoint path."""
    from vidtune.model.loading import ModelSource, load_models

    return load_models(ModelSource(preset=None, checkpoint=str(folder / "model.safetensors"),
                                   upsampler=str(folder / "spatial_upsampler.safetensors")), dtype=dtype)


def _training_summary(checkpoint: Path) -> dict[str, Any]:
    """The per-component training summary an export (or a teacher file) carries in its metadata."""
    from safetensors import safe_open

    with safe_open(str(checkpoint), framework="pt") as f:
        return json.loads((f.metadata() or {}).get("vidtune_training", "{}"))


TEACHER_PARTS = ("transformer", "text_encoder")
TEACHER_FILE = "teacher.safetensors"


def _teacher_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """A teacher's transformer and text encoder, keys prefixed by the part: from ``teacher.safetensors``,
    or taken out of an export folder."""
    import safetensors.torch

    if (folder / TEACHER_FILE).is_file():
        return safetensors.torch.load_file(str(folder / TEACHER_FILE))
    models = _export_models(folder, torch.bfloat16)
    return {f"{part}.{k}": v.contiguous() for part, m in zip(TEACHER_PARTS, (models.transformer.velocity_model,
                                                                             models.text_encoder))
            for k, v in m.state_dict().items()}


def _load_teacher(folder: str, device: Any) -> dict[str, Any]:
    """The frozen float32 teacher transformer and text encoder of a teacher folder (``teacher.safetensors``,
    or an export), with its provenance; a guidance-distilled teacher is refused (distilling from it would
    compound the guidance)."""
    files = Path(folder)
    checkpoint = files / TEACHER_FILE if (files / TEACHER_FILE).is_file() else files / "model.safetensors"
    if not checkpoint.is_file():
        raise ValueError(f"teacher: {folder} holds neither {TEACHER_FILE} (`train teacher`) nor model.safetensors "
                         "(an export folder)")
    training = _training_summary(checkpoint).get("transformer", {})
    if training.get("distilled"):
        raise ValueError(f"teacher: {checkpoint} is itself guidance-distilled ({training['distilled']}); use the "
                         "undistilled checkpoint it was distilled from (its `teacher_steps`; model/mini/README.md)")
    tensors = _teacher_tensors(files)
    modules = []
    for part in TEACHER_PARTS:
        m = build(part, device)
        m.load_state_dict({k[len(part) + 1:]: v.float() for k, v in tensors.items() if k.startswith(part + ".")})
        modules.append(m.eval().requires_grad_(False))
    return {"modules": tuple(modules), "teacher_steps": int(training.get("steps", 0))}


def write_teacher(export_folder: str, to: str) -> dict[str, Any]:
    """The parts of an export a distillation teacher uses, the transformer and the text encoder (bf16,
    5.9 MB against the export's 18.7 MB, so the teacher fits in a device call beside the tree), as
    ``<to>/teacher.safetensors`` with the export's training summary."""
    import safetensors.torch

    files = Path(export_folder)
    out = Path(to)
    out.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_file(_teacher_tensors(files), str(out / TEACHER_FILE), metadata={
        "vidtune_training": json.dumps(_training_summary(files / "model.safetensors"))})
    return {"teacher": str(out / TEACHER_FILE), "bytes": (out / TEACHER_FILE).stat().st_size}


@torch.no_grad()
def _measure_stats(cfg: TrainConfig, mods: dict, device: Any, clips: int = 8) -> dict[str, list[float]]:
    """Per-channel mean and std of the raw latent means over held-out clips (the VAE's statistics)."""
    seeds = [HELD_OUT_SEED + 500_000 + i for i in range(clips)]
    if cfg.component == "video_vae":
        enc = mods["video_encoder"]
        lat = torch.cat([enc(clip_batch([s], cfg.frames, cfg.height, cfg.width, cfg.fps, device)["video"]) for s in seeds])
        flat = lat.float().transpose(0, 1).reshape(lat.shape[1], -1)
    else:
        from ltx_core.components.patchifiers import AudioPatchifier

        enc = mods["audio_encoder"]
        mels = [_mel(clip_batch([s], cfg.frames, cfg.height, cfg.width, cfg.fps, device, audio_rate=AUDIO_RATE)["audio"],
                     mods["_processor"]) for s in seeds]
        lat = torch.cat([AudioPatchifier(patch_size=1).patchify(enc(m)) for m in mels], dim=1)  # [1, T, 128]
        flat = lat.float()[0].T
    return {"mean": flat.mean(1).tolist(), "std": flat.std(1).clamp_min(1e-3).tolist()}


def _apply_stats(module: torch.nn.Module, state_path: Path) -> None:
    stats = torch.load(state_path, map_location="cpu", weights_only=False)["stats"]
    _set_stats(module, stats)


@torch.no_grad()
def _set_stats(module: torch.nn.Module, stats: dict[str, list[float]]) -> None:
    pcs = module.per_channel_statistics
    pcs.get_buffer("mean-of-means").copy_(torch.tensor(stats["mean"]))
    pcs.get_buffer("std-of-means").copy_(torch.tensor(stats["std"]))


# ----------------------------------------------------------------------------- export
def export(out: str, to: str) -> dict[str, Any]:
    """Write the trained components as an LTX-2 checkpoint (bf16) + the text encoder under ``text_encoder.``."""
    import safetensors.torch

    from vidtune.model.presets import get_preset
    from vidtune.model.weights import save_checkpoint

    run = Path(out)
    mods: dict[str, torch.nn.Module] = {}
    summary: dict[str, Any] = {}
    for component in COMPONENTS:
        state = torch.load(run / f"{component}.pt", map_location="cpu", weights_only=False)
        for part in _parts(component):
            m = build(part, "cpu")
            m.load_state_dict(state["model"][part])
            mods[part] = m
        summary[component] = {"steps": state["step"],
                              "seconds": round(state.get("seconds", 0.0) + state.get("seconds_before", 0.0), 1),
                              "last": state["log"][-1] if state["log"] else None}
        if state.get("distilled"):
            summary[component]["distilled"] = state["distilled"]
        if component == "video_vae":
            _set_stats(mods["video_encoder"], state["stats"])
            _set_stats(mods["video_decoder"], state["stats"])
        if component == "audio_vae":
            _set_stats(mods["audio_decoder"], state["stats"])
    preset = get_preset(PRESET)
    target = Path(to)
    components = {k: mods[k].to(torch.bfloat16) for k in ("transformer", "video_encoder", "video_decoder",
                                                          "audio_decoder", "vocoder", "upsampler")}
    files = save_checkpoint(components, preset.config, preset.upsampler_config, target)
    # the text encoder joins the main file under its own prefix; ltx-core's loaders ignore it
    tensors = safetensors.torch.load_file(str(files.checkpoint))
    for k, v in mods["text_encoder"].to(torch.bfloat16).state_dict().items():
        tensors["text_encoder." + k] = v.contiguous()
    meta = {"config": json.dumps(preset.config),
            "vidtune_text_encoder": json.dumps(mods["text_encoder"].config_dict()),
            "vidtune_training": json.dumps(summary)}
    safetensors.torch.save_file(tensors, str(files.checkpoint), metadata=meta)
    # the audio encoder is not part of the pipeline (nor of the shipped 20 MB); it is kept beside the
    # run so a later session can continue training in the same audio latent space (``import``)
    safetensors.torch.save_file({k: v.contiguous() for k, v in mods["audio_encoder"].to(torch.bfloat16).state_dict().items()},
                                str(run / "audio_encoder.safetensors"), metadata={"stats": json.dumps(
                                    torch.load(run / "audio_vae.pt", map_location="cpu", weights_only=False)["stats"])})
    sizes = {p.name: p.stat().st_size for p in (files.checkpoint, files.upsampler)}
    return {"files": {k: str(v) for k, v in asdict(files).items()}, "bytes": sizes, "training": summary}


def import_export(weights: str, audio_encoder: str, out: str) -> dict[str, Any]:
    """Turn a shipped export (+ the audio encoder kept beside it) back into run states to continue training.

    Weights come back in float32 from bf16, the optimiser starts afresh (its state is not shipped), and
    each component keeps its step count and log summary from the export's ``vidtune_training`` metadata.
    """
    import safetensors.torch
    from safetensors import safe_open

    files = Path(weights)
    models = _export_models(files, torch.float32)
    training = _training_summary(files / "model.safetensors")
    with safe_open(audio_encoder, framework="pt") as f:
        audio_stats = json.loads((f.metadata() or {})["stats"])
    enc_state = {k: v.float() for k, v in safetensors.torch.load_file(audio_encoder).items()}
    loaded = {"transformer": models.transformer.velocity_model, "video_encoder": models.video_encoder,
              "video_decoder": models.video_decoder, "audio_decoder": models.audio_decoder, "vocoder": models.vocoder,
              "upsampler": models.upsampler, "text_encoder": models.text_encoder}
    stats = {"video_vae": {"mean": models.video_encoder.per_channel_statistics.get_buffer("mean-of-means").tolist(),
                           "std": models.video_encoder.per_channel_statistics.get_buffer("std-of-means").tolist()},
             "audio_vae": audio_stats}
    run = Path(out)
    run.mkdir(parents=True, exist_ok=True)
    for component in COMPONENTS:
        state = {}
        for part in _parts(component):
            module = build(part, "cpu")
            src = enc_state if part == "audio_encoder" else {k: v.float() for k, v in loaded[part].state_dict().items()}
            module.load_state_dict(src)
            if component in stats:  # training runs with identity statistics; the measured ones ride along
                identity_latent_statistics(module)
            state[part] = module.state_dict()
        info = training.get(component, {})
        # the learning-rate schedule of the continued run starts afresh: its clock (seconds) restarts
        blob = {"model": state, "opt": None, "step": int(info.get("steps", 0)), "seconds": 0.0,
                "seconds_before": float(info.get("seconds", 0.0)),
                "log": [info["last"]] if info.get("last") else [], "config": {"imported_from": str(files)}}
        if component in stats:
            blob["stats"] = stats[component]
        if info.get("distilled"):
            blob["distilled"] = info["distilled"]
        torch.save(blob, run / f"{component}.pt")
    return {"run": str(run), "steps": {c: training.get(c, {}).get("steps", 0) for c in COMPONENTS}}


# Every TrainConfig field but component, out, device (their own options) and amp (automatic) is a command-line
# option, listed from the dataclass so none is parsed and then dropped (--colour-weight was, until
# 2026-11-30: the third checkpoint's phase-A VAE steps ran unweighted; results/mini/checks/video_vae_grey_6.md).
_CLI_INT = tuple(f.name for f in fields(TrainConfig) if f.type in (int, "int") and f.name not in ("component", "out"))
_CLI_FLOAT = tuple(f.name for f in fields(TrainConfig) if f.type in (float, "float"))
_CLI_STR = tuple(f.name for f in fields(TrainConfig) if f.type in (str, "str") and f.name not in ("component", "out", "device"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vidtune.model.mini.train", description=__doc__.split("\n\n")[0])
    p.add_argument("component", choices=[*COMPONENTS, "export", "import", "teacher"],
                   help="teacher: write --out/teacher.safetensors from the export in --to (distillation's teacher)")
    p.add_argument("--audio-encoder", default="results/mini/audio_encoder.safetensors",
                   help="import: the audio encoder kept beside the export")
    p.add_argument("--out", required=True, help="run folder (resumable state per component)")
    p.add_argument("--to", default="model/mini/weights", help="export: folder of the shipped checkpoint")
    for f in _CLI_INT:
        p.add_argument(f"--{f.replace('_', '-')}", type=int, default=getattr(TrainConfig, f))
    for f in _CLI_FLOAT:
        p.add_argument(f"--{f.removesuffix('_s').replace('_', '-')}", dest=f, type=float, default=getattr(TrainConfig, f))
    for f in _CLI_STR:
        p.add_argument(f"--{f.replace('_', '-')}", default=getattr(TrainConfig, f))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args(argv)
    if a.component == "export":
        print(json.dumps(export(a.out, a.to), indent=2))
        return 0
    if a.component == "teacher":
        print(json.dumps(write_teacher(a.to, a.out), indent=2))
        return 0
    if a.component == "import":
        print(json.dumps(import_export(a.to, a.audio_encoder, a.out), indent=2))
        return 0
    cfg = TrainConfig(component=a.component, out=a.out, device=a.device, **{k: getattr(a, k) for k in _CLI_INT + _CLI_FLOAT + _CLI_STR})
    print(json.dumps(train(cfg)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
