"""Quality against the baseline: PSNR and SSIM over raw uint8 frames, SNR over the audio waveform."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

__all__ = ["Quality", "quality", "psnr_db", "audio_snr_db", "PSNR_CAP_DB"]

# Identical frames have infinite PSNR; we cap at 100 dB (an MSE of 6.5e-6 on 0..255 values, far below
# one least-significant bit over a whole frame) so means stay finite and JSON-able. ``identical`` says
# when the frames really are equal.
PSNR_CAP_DB = 100.0


@dataclass(frozen=True)
class Quality:
    """Quality of an output against the baseline of the same request and seed."""

    psnr_db: float  # mean over frames of per-frame PSNR (capped at PSNR_CAP_DB)
    psnr_db_worst: float  # the worst frame's PSNR
    ssim: float  # mean over frames (scikit-image, RGB, data_range 255)
    ssim_worst: float
    audio_snr_db: float  # 10 log10(|ref|^2 / |ref - out|^2), capped at PSNR_CAP_DB
    identical: bool  # frames and audio bit-identical

    def to_dict(self) -> dict:
        return asdict(self)


def psnr_db(reference: torch.Tensor, output: torch.Tensor) -> np.ndarray:
    """Per-frame PSNR in dB of uint8 frames [F, H, W, 3] (peak 255), capped at ``PSNR_CAP_DB``."""
    _check_frames(reference, output)
    ref = reference.to(torch.float64)
    out = output.to(torch.float64)
    mse = ((ref - out) ** 2).flatten(1).mean(1).numpy()
    with np.errstate(divide="ignore"):
        values = 10.0 * np.log10(255.0**2 / mse)
    return np.minimum(values, PSNR_CAP_DB)


def audio_snr_db(reference: torch.Tensor, output: torch.Tensor) -> float:
    """SNR in dB of an audio waveform against the reference (same shape), capped at ``PSNR_CAP_DB``."""
    if reference.shape != output.shape:
        raise ValueError(f"audio shapes differ: reference {tuple(reference.shape)} vs output {tuple(output.shape)}")
    ref = reference.double()
    noise = float(((ref - output.double()) ** 2).sum())
    signal = float((ref**2).sum())
    if noise == 0.0:
        return PSNR_CAP_DB
    if signal == 0.0:
        return -PSNR_CAP_DB
    return min(PSNR_CAP_DB, 10.0 * math.log10(signal / noise))


def _check_frames(reference: torch.Tensor, output: torch.Tensor) -> None:
    if reference.dtype != torch.uint8 or output.dtype != torch.uint8:
        raise ValueError(f"quality is measured on raw uint8 frames, got {reference.dtype} and {output.dtype}")
    if reference.shape != output.shape:
        raise ValueError(f"frame shapes differ: reference {tuple(reference.shape)} vs output {tuple(output.shape)}")


def quality(ref_frames: torch.Tensor, ref_audio: torch.Tensor, frames: torch.Tensor, audio: torch.Tensor) -> Quality:
    """PSNR, SSIM and audio SNR of an output against the baseline."""
    from skimage.metrics import structural_similarity

    psnr = psnr_db(ref_frames, frames)
    r, o = ref_frames.numpy(), frames.numpy()
    ssim = np.array([structural_similarity(r[i], o[i], channel_axis=-1, data_range=255) for i in range(len(r))])
    identical = bool(torch.equal(ref_frames, frames) and torch.equal(ref_audio, audio))
    return Quality(
        psnr_db=float(psnr.mean()),
        psnr_db_worst=float(psnr.min()),
        ssim=float(ssim.mean()),
        ssim_worst=float(ssim.min()),
        audio_snr_db=audio_snr_db(ref_audio, audio),
        identical=identical,
    )
