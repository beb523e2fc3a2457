"""ltx2-mini's training parts: the training configuration, the procedural clips and batches, the components
built from the preset, the optimiser's groups and the VAEs' latent statistics."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from vidtune.model.mini.data import render_audio, render_video, sample_scene
from vidtune.model.mini.text_encoder import MiniTextEncoder, TextEncoderConfig
from vidtune.model.weights import identity_latent_statistics

__all__ = ["COMPONENTS", "HELD_OUT_SEED", "PRESET", "TEXT_WIDTH", "AUDIO_RATE", "VOCODER_RATE", "TrainConfig",
           "clip_batch", "log_mel", "processor", "build", "parts_of", "load_frozen", "to_device", "make_batch",
           "param_groups", "measure_stats", "apply_stats", "set_stats"]


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


def log_mel(audio: torch.Tensor, processor: Any) -> torch.Tensor:
    """Log-mel in float32 (outside autocast: the log of a bf16 filterbank product loses too much)."""
    from ltx_core.types import Audio

    with torch.autocast(audio.device.type, enabled=False):
        return processor.waveform_to_mel(Audio(waveform=audio.float(), sampling_rate=AUDIO_RATE)).float()


def processor(device: Any) -> Any:
    from ltx_core.model.audio_vae.ops import AudioProcessor

    return AudioProcessor(target_sample_rate=AUDIO_RATE, mel_bins=64, mel_hop_length=160, n_fft=1024).to(device)


# ----------------------------------------------------------------------------- models
def build(component: str, device: Any) -> torch.nn.Module:
    """A fresh float32 module of the mini preset (seeded): an ltx-core class, or the text encoder."""
    from ltx_core.model.audio_vae import AudioEncoderConfigurator

    from vidtune.model.presets import get_preset
    from vidtune.model.weights import configurators

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
        module = configurators()["upsampler"].from_config(preset.upsampler_config)
    else:
        module = configurators()[component].from_config(preset.config)
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


def parts_of(component: str) -> tuple[str, ...]:
    return {"video_vae": ("video_encoder", "video_decoder"), "audio_vae": ("audio_encoder", "audio_decoder"),
            "vocoder": ("vocoder",), "upsampler": ("upsampler",),
            "transformer": ("transformer", "text_encoder")}[component]


def load_frozen(out: Path, component: str, device: Any) -> dict[str, torch.nn.Module]:
    path = out / f"{component}.pt"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: train `{component}` first")
    state = torch.load(path, map_location="cpu", weights_only=False)
    mods = {}
    for part in parts_of(component):
        m = build(part, device)
        m.load_state_dict(state["model"][part])
        mods[part] = m.eval().requires_grad_(False)
    return mods



def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor on ``device``; to a GPU from pinned memory without blocking, because a copy from
    pageable memory waits for the GPU's queue to drain and the step's launches then cannot run ahead."""
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


# ----------------------------------------------------------------------------- the loop
def make_batch(cfg: TrainConfig, step: int, device: Any) -> dict[str, Any]:
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




@torch.no_grad()
def measure_stats(cfg: TrainConfig, mods: dict, device: Any, clips: int = 8) -> dict[str, list[float]]:
    """Per-channel mean and std of the raw latent means over held-out clips (the VAE's statistics)."""
    seeds = [HELD_OUT_SEED + 500_000 + i for i in range(clips)]
    if cfg.component == "video_vae":
        enc = mods["video_encoder"]
        lat = torch.cat([enc(clip_batch([s], cfg.frames, cfg.height, cfg.width, cfg.fps, device)["video"]) for s in seeds])
        flat = lat.float().transpose(0, 1).reshape(lat.shape[1], -1)
    else:
        from ltx_core.components.patchifiers import AudioPatchifier

        enc = mods["audio_encoder"]
        mels = [log_mel(clip_batch([s], cfg.frames, cfg.height, cfg.width, cfg.fps, device, audio_rate=AUDIO_RATE)["audio"],
                     mods["processor"]) for s in seeds]
        lat = torch.cat([AudioPatchifier(patch_size=1).patchify(enc(m)) for m in mels], dim=1)  # [1, T, 128]
        flat = lat.float()[0].T
    return {"mean": flat.mean(1).tolist(), "std": flat.std(1).clamp_min(1e-3).tolist()}


def apply_stats(module: torch.nn.Module, state_path: Path) -> None:
    stats = torch.load(state_path, map_location="cpu", weights_only=False)["stats"]
    set_stats(module, stats)


@torch.no_grad()
def set_stats(module: torch.nn.Module, stats: dict[str, list[float]]) -> None:
    pcs = module.per_channel_statistics
    pcs.get_buffer("mean-of-means").copy_(torch.tensor(stats["mean"]))
    pcs.get_buffer("std-of-means").copy_(torch.tensor(stats["std"]))
