"""Quality against the baseline: PSNR, SSIM, temporal PSNR and FLIP over raw uint8 frames; SNR and a
multi-resolution spectral distance over the audio waveform.

Why these, beside PSNR and SSIM (which measure how far the sampling trajectory drifted more than what a
viewer sees):
- temporal PSNR: the PSNR of the frame-to-frame change, candidate against baseline. An error that stays put
  (a slightly shifted colour) leaves it high; one that changes from frame to frame (flicker, popping tiles,
  a cache refreshing) lowers it. Exact integer sums, in the same pass as PSNR, on the frames' device.
- FLIP (NVIDIA's perceptual difference, ``flip-evaluator``): a per-pixel difference built from a model of
  human contrast sensitivity, colour and edge/point detection at a viewing distance (67 pixels per degree),
  0 (same) to 1. It needs no learned weights (LPIPS would need a download) and is a library NVIDIA keeps.
  It took 0.6 s for one 512x768 frame and 2.2 s for a 1024x1536 one on this repository's 2-core CPU (tests
  running beside it), so it is computed on ``flip_frames`` frames: the worst frame by PSNR and frames evenly
  spaced over the video (a frame equal to the baseline's scores 0 unrun). On a CUDA device the same model
  runs in PyTorch where the frames are (``search/flip.py``: equal to the library within 1e-5 a pixel on the
  CPU, 2e-5 on the H200; 10-12 ms a 1024x1536 frame there against the library's 1.3-2.3 s on its host).
- audio spectral distance: the mean absolute difference of log magnitudes (dB) over three STFT resolutions,
  floored 60 dB under the reference's peak: a waveform SNR punishes a phase shift that is inaudible, a
  log-magnitude spectrum does not.
- audio-video offset: how far the candidate's sound moved against its picture, relative to the baseline's
  (ms, + audio later). ltx2-mini's evidence measures the sync of one kind of scene (clicks against the
  bounces of a prompted colour); a gate needs it for any video, so this measures each stream's shift
  against the baseline's own stream instead: the audio's by the cross-correlation of the 1 ms RMS
  envelopes, the video's by the frame shift that best matches the baseline's frames (coarse grey
  thumbnails), and subtracts them. 0 when neither moved; a shift of both together is no offset.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch

from vidtune.search.defaults import FLIP_FRAMES  # (re-exported)

__all__ = ["Quality", "quality", "psnr_db", "temporal_psnr_db", "ssim_per_frame", "flip_per_frame", "audio_snr_db",
           "audio_spectral_db", "audio_spectral_snr_db", "av_offset_ms", "AV_MAX_SHIFT_MS", "PSNR_CAP_DB", "FLIP_FRAMES"]

# Identical frames have infinite PSNR; we cap at 100 dB (an MSE of 6.5e-6 on 0..255 values, far below
# one least-significant bit over a whole frame) so means stay finite and JSON-able. ``identical`` says
# when the frames really are equal.
PSNR_CAP_DB = 100.0
AV_MAX_SHIFT_MS = 250.0  # the audio-video offset's search range either way (lip-sync is noticed from ~45 ms)
VIDEO_SHIFT_EVIDENCE = 0.5  # a video shift must leave at most this share of the unshifted frames' difference


@dataclass(frozen=True)
class Quality:
    """Quality of an output against the baseline of the same request and seed."""

    psnr_db: float  # mean over frames of per-frame PSNR (capped at PSNR_CAP_DB)
    psnr_db_worst: float  # the worst frame's PSNR
    ssim: float  # mean over frames (scikit-image, RGB, data_range 255)
    ssim_worst: float
    audio_snr_db: float  # 10 log10(|ref|^2 / |ref - out|^2), capped at PSNR_CAP_DB
    identical: bool  # frames and audio bit-identical
    # (defaults: a record written before these metrics existed reads as unmeasured for them, see Gate)
    temporal_psnr_db: float | None = None  # mean over consecutive frame pairs of the PSNR of the change
    temporal_psnr_db_worst: float | None = None
    flip: float | None = None  # mean FLIP (0 same .. 1) over the frames in ``flip_frames``
    flip_worst: float | None = None
    flip_frames: tuple[int, ...] = ()
    audio_spectral_db: float | None = None  # mean |log-magnitude difference| in dB over 3 STFT resolutions
    audio_spectral_snr_db: float | None = None  # magnitude spectrogram SNR (-20 log10 spectral convergence)
    av_offset_ms: float | None = None  # audio's shift minus video's, each against the baseline's (+: audio later)

    def to_dict(self) -> dict:
        return asdict(self)


def _chunk_frames(reference: torch.Tensor, budget: int = 20_000_000) -> int:
    """Frames per chunk so that a float64 working set of ~12 maps of a chunk stays near ``budget`` values."""
    return max(1, budget // max(1, reference[0].numel()))


def _sum_squares(d: torch.Tensor) -> torch.Tensor:
    """Per-frame sum of squares of integer differences [n, ...], exact (int32 squares, int64 sums)."""
    d = d.to(torch.int32)
    return (d * d).flatten(1).sum(1, dtype=torch.int64)


def _squared_errors(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-frame sum of squared differences of uint8 frames, exact: int16 differences, int64 sums."""
    return _sum_squares(x.to(torch.int16) - y.to(torch.int16))


def _temporal_squared_errors(d: torch.Tensor, previous: torch.Tensor | None) -> torch.Tensor:
    """Per frame pair, the sum of squares of the change of the error ``d = out - ref`` (int16 [n, ...])
    from one frame to the next, ``(out_t - out_t-1) - (ref_t - ref_t-1)``; ``previous`` is the error of
    the frame before the chunk (None at the first chunk). Exact (|change| <= 510)."""
    if previous is not None:
        d = torch.cat([previous[None], d])
    return _sum_squares(d[1:] - d[:-1]) if len(d) > 1 else torch.zeros(0, dtype=torch.int64, device=d.device)


def _psnr_from_sse(sse: np.ndarray, per_frame: int) -> np.ndarray:
    mse = sse.astype(np.float64) / per_frame
    with np.errstate(divide="ignore"):
        values = 10.0 * np.log10(255.0**2 / mse)
    return np.minimum(values, PSNR_CAP_DB)


def psnr_db(reference: torch.Tensor, output: torch.Tensor) -> np.ndarray:
    """Per-frame PSNR in dB of uint8 frames [F, H, W, 3] (peak 255), capped at ``PSNR_CAP_DB``.

    Computed where ``output`` lives (the pipeline's device in a trial), a chunk of frames at a time, from
    exact integer sums of squared differences (int64), so it equals scikit-image's
    ``peak_signal_noise_ratio(r, o, data_range=255)`` per frame whatever the device; no float copy of the
    video is made (the float64 copy on the host was ~14 GB at 1536x1024x121).
    """
    _check_frames(reference, output)
    dev, chunk = output.device, _chunk_frames(reference)
    sse = torch.cat([_squared_errors(reference[i:i + chunk].to(dev), output[i:i + chunk]).cpu()
                     for i in range(0, len(reference), chunk)])
    return _psnr_from_sse(sse.numpy(), reference[0].numel())


def temporal_psnr_db(reference: torch.Tensor, output: torch.Tensor) -> np.ndarray:
    """Per consecutive frame pair, the PSNR (peak 255, capped) of the output's frame-to-frame change against
    the reference's: ``10 log10(255^2 / mean(((o_t - o_t-1) - (r_t - r_t-1))^2))``; F - 1 values."""
    _check_frames(reference, output)
    dev, chunk = output.device, _chunk_frames(reference)
    out, previous = [], None
    for i in range(0, len(reference), chunk):
        d = output[i:i + chunk].to(torch.int16) - reference[i:i + chunk].to(dev).to(torch.int16)
        out.append(_temporal_squared_errors(d, previous).cpu())
        previous = d[-1]
    return _psnr_from_sse(torch.cat(out).numpy(), reference[0].numel())


def flip_frame_indices(psnr: np.ndarray, count: int) -> list[int]:
    """The frames FLIP is computed on: the worst by PSNR, then ``count - 1`` evenly spaced (first and last
    included), without repeats, in order."""
    if count <= 0 or len(psnr) == 0:
        return []
    chosen = {int(np.argmin(psnr))}
    if count > 1:
        chosen.update(int(round(x)) for x in np.linspace(0, len(psnr) - 1, count - 1))
    return sorted(chosen)


def flip_per_frame(reference: torch.Tensor, output: torch.Tensor, frames: list[int],
                   device: torch.device | str | None = None) -> list[float]:
    """Mean FLIP error (LDR, sRGB, 67 pixels per degree) of each listed frame. On a CUDA device from
    ``search/flip.py`` (the same model in PyTorch, equal to the library within 2e-5 a pixel; the frames do
    not leave the GPU), elsewhere from ``flip-evaluator`` (on the CPU the faster of the two)."""
    dev = torch.device(device) if device is not None else output.device
    if dev.type == "cuda":
        from vidtune.search.flip import flip_mean

        return [float(v) for v in flip_mean(reference[frames].to(dev), output[frames].to(dev)).cpu()] if frames else []
    try:
        import flip_evaluator
    except ImportError:  # (a dependency in pyproject.toml; the device image has to be given it)
        raise ImportError("the FLIP metric needs the flip-evaluator package (pip install flip-evaluator); "
                          "eval.flip_frames=0 leaves the metric out") from None
    out = []
    for i in frames:
        r = reference[i].cpu().numpy().astype(np.float32) / 255.0
        o = output[i].cpu().numpy().astype(np.float32) / 255.0
        if np.array_equal(r, o):
            out.append(0.0)
            continue
        _, mean, _ = flip_evaluator.evaluate(r, o, "LDR", applyMagma=False)
        out.append(float(mean))
    return out


_STFT_SIZES = (512, 1024, 2048)


def _magnitudes(reference: torch.Tensor, output: torch.Tensor):
    """(|STFT| of the reference, of the output) for each resolution the clip is long enough for."""
    if reference.shape != output.shape:
        raise ValueError(f"audio shapes differ: reference {tuple(reference.shape)} vs output {tuple(output.shape)}")
    ref, out = reference.double().reshape(-1, reference.shape[-1]), output.double().reshape(-1, output.shape[-1])
    for n in _STFT_SIZES:
        if ref.shape[-1] >= n:
            window = torch.hann_window(n, dtype=torch.float64, device=ref.device)
            yield tuple(torch.stft(x, n, n // 4, window=window, return_complex=True).abs() for x in (ref, out))


def audio_spectral_db(reference: torch.Tensor, output: torch.Tensor) -> float:
    """Mean absolute difference in dB of STFT magnitudes (Hann windows of 512, 1024 and 2048 samples, hop a
    quarter), each floored 60 dB below the reference's peak magnitude at that resolution, averaged over the
    resolutions; 0 for equal waveforms. Audio [C, samples] or [samples]. (Floored 80 dB down, on ltx2-mini
    the bf16 output's quantisation noise filled the quiet bins: every change scored 2.5-2.7 dB, the
    harshest calibration rung 10% above the mildest; 60 dB down, 0.075-0.14 dB.)"""
    values = []
    for sr, so in _magnitudes(reference, output):
        floor = max(float(sr.max()), 1e-12) * 1e-3
        values.append(float((20 * (torch.log10(sr.clamp_min(floor)) - torch.log10(so.clamp_min(floor)))).abs().mean()))
    return float(np.mean(values)) if values else 0.0


def audio_spectral_snr_db(reference: torch.Tensor, output: torch.Tensor) -> float:
    """SNR of the STFT magnitudes in dB: 20 log10(|S_ref| / |S_ref - S_out|) with Frobenius norms over every
    channel, frame and bin (minus the spectral convergence of multi-resolution STFT losses, in dB), at the
    resolutions of audio_spectral_db, averaged; capped at PSNR_CAP_DB (equal magnitudes). Phase-blind, so a
    changed fine structure of the same sound is not counted as noise, and weighted by energy, so quiet bins
    count for what they hold. (audio_spectral_db averages |log| differences over every bin down to 60 dB below
    the peak: on ltx2-mini's quiet audio (peak ~0.06-0.09) the bins near that floor decide it, and it read
    0.06-0.33 dB for FP8 and skipping every 4th step across six clips against 0.15-1.45 dB for another seed's
    audio: its tier ceilings of 0.1-0.15 dB sat on its floor. This one read 20-44 dB for those settings over 12
    clips (30-44 on the six short ones), 7-25 dB for another seed's audio, 0 for silence;
    results/calibration/audio/.)"""
    values = []
    for sr, so in _magnitudes(reference, output):
        signal, noise = float(sr.norm()), float((sr - so).norm())
        if noise == 0.0:
            values.append(PSNR_CAP_DB)
        elif signal == 0.0:
            values.append(0.0)
        else:
            values.append(min(PSNR_CAP_DB, 20 * math.log10(signal / noise)))
    return float(np.mean(values)) if values else PSNR_CAP_DB


def _best_shift(score: Callable[[int], float], limit: int) -> int:
    """The shift in [-limit, limit] with the highest score; ties go to the smallest |shift| (0 first)."""
    return max(sorted(range(-limit, limit + 1), key=abs), key=score)


def _audio_shift_ms(reference: torch.Tensor, output: torch.Tensor, sample_rate: int, max_ms: float) -> float:
    """How many ms ``output``'s audio lags ``reference``'s: the lag maximising the correlation of their 1 ms
    RMS envelopes (mean removed), channels averaged; 0 for equal or silent audio."""
    if torch.equal(reference, output):
        return 0.0
    hop = max(1, sample_rate // 1000)
    env = []
    for x in (reference, output):
        m = x.double().reshape(-1, x.shape[-1]).mean(0)
        m = m[: m.shape[0] // hop * hop].reshape(-1, hop).pow(2).mean(1).sqrt()
        env.append(m - m.mean())
    a, b = env
    if float(a.abs().max()) == 0.0 or float(b.abs().max()) == 0.0:
        return 0.0
    n = a.shape[0]
    limit = min(int(max_ms * sample_rate / (1000 * hop)), n - 1)

    def score(lag: int) -> float:  # output[t + lag] against reference[t], over the overlap, per sample
        ra, rb = (a[: n - lag], b[lag:]) if lag >= 0 else (a[-lag:], b[: n + lag])
        return float((ra * rb).sum()) / ra.shape[0]

    return _best_shift(score, limit) * hop * 1000.0 / sample_rate


def _thumbnails(frames: torch.Tensor) -> torch.Tensor:
    """32 x 32 grey thumbnails of uint8 frames [F, H, W, 3] -> [F, 1024] float64 on the host (computed where
    the frames are)."""
    g = frames.float().mean(-1, keepdim=True).permute(0, 3, 1, 2)
    return torch.nn.functional.adaptive_avg_pool2d(g, (32, 32)).flatten(1).double().cpu()


def _video_shift_frames(a: torch.Tensor, b: torch.Tensor, limit: int) -> int:
    """How many frames the output lags the reference, from their thumbnails ``a``, ``b`` [F, 1024]: the shift
    whose overlapping frames differ least (mean squared difference); 0 for equal or still video."""
    n = a.shape[0]
    if limit <= 0 or n < 2:
        return 0
    limit = min(limit, n - 1)

    def score(s: int) -> float:
        ra, rb = (a[: n - s], b[s:]) if s >= 0 else (a[-s:], b[: n + s])
        return -round(float((ra - rb).pow(2).mean()), 9)  # (rounded: equal frames tie exactly)

    best = _best_shift(score, limit)
    # A shift counts only when it explains the difference far better than none: a degraded video that kept
    # its timing can match a neighbouring frame slightly better than its own (on ltx2-mini Sol's rungs did,
    # by one frame, 17-frame clips), a delayed one matches the shifted frames almost exactly.
    return best if best == 0 or -score(best) <= VIDEO_SHIFT_EVIDENCE * -score(0) else 0


def av_offset_ms(ref_frames: torch.Tensor, ref_audio: torch.Tensor, frames: torch.Tensor, audio: torch.Tensor,
                 fps: float, sample_rate: int, max_ms: float = AV_MAX_SHIFT_MS) -> float:
    """The candidate's audio-video offset against the baseline's, in ms (+: its audio moved later than its
    video): the audio's shift against the baseline's audio minus the video's against the baseline's video,
    each searched within ``max_ms``; resolution 1 ms for the audio, a frame for the video."""
    chunk = _chunk_frames(ref_frames)
    a, b = (torch.cat([_thumbnails(x[i:i + chunk]) for i in range(0, len(x), chunk)]) for x in (ref_frames, frames))
    return _av_offset(a, b, ref_audio, audio, fps, sample_rate, max_ms)


def _av_offset(ref_thumbs: torch.Tensor, thumbs: torch.Tensor, ref_audio: torch.Tensor, audio: torch.Tensor,
               fps: float, sample_rate: int, max_ms: float = AV_MAX_SHIFT_MS) -> float:
    video = _video_shift_frames(ref_thumbs, thumbs, int(max_ms * fps / 1000)) * 1000.0 / fps
    return _audio_shift_ms(ref_audio, audio, sample_rate, max_ms) - video


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


def _ssim_chunk(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """scikit-image's SSIM (see ``ssim_per_frame``) of each frame of two uint8 chunks [n, H, W, 3], float64."""
    c1, c2, cov = (0.01 * 255) ** 2, (0.03 * 255) ** 2, 49.0 / 48.0
    x, y = x.permute(0, 3, 1, 2).double(), y.permute(0, 3, 1, 2).double()

    def box(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.avg_pool2d(t, 7, stride=1)

    ux, uy = box(x), box(y)
    vx, vy, vxy = cov * (box(x * x) - ux * ux), cov * (box(y * y) - uy * uy), cov * (box(x * y) - ux * uy)
    s = ((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux * ux + uy * uy + c1) * (vx + vy + c2))
    return s.mean(dim=(2, 3)).mean(dim=1)


def _check_ssim_size(frames: torch.Tensor) -> None:
    if frames.shape[1] < 7 or frames.shape[2] < 7:
        raise ValueError(f"SSIM needs frames of at least 7x7 pixels, got {tuple(frames.shape[1:3])}")


def ssim_per_frame(reference: torch.Tensor, output: torch.Tensor, device: torch.device | str | None = None) -> np.ndarray:
    """SSIM of each frame, equal to scikit-image's ``structural_similarity(r, o, channel_axis=-1,
    data_range=255)`` with its defaults (7x7 uniform window, sample covariance 49/48, K1 0.01, K2 0.03,
    the 3-pixel border left out, channels averaged), computed with torch in float64 on ``device``
    (default: where ``output`` lives), a chunk of frames at a time.

    Why: scikit-image took 17.6 s per 121 random 768x512 frames (8 timed, scaled) on this repository's 2-core CPU (tests
    running beside it), single-threaded. Each whole-pipeline trial of the H200 campaign spent 17.6-22.1 s
    beyond its 4 pipeline runs (wall time minus 4 x the median total; not timed apart, SSIM presumably
    much of it); on a GPU SSIM is a few float64 pooling kernels. On a CPU scikit-image stays faster (the
    torch float64 path: 55 s per 121 frames, 24 timed, under the same load), so ``quality`` uses
    this on CUDA only.
    The windows that touch the border are exactly the ones scikit-image crops, so a valid (unpadded)
    7x7 average gives its cropped map; ``tests/test_metrics_media.py`` checks the equality to 1e-9.
    """
    _check_frames(reference, output)
    _check_ssim_size(reference)
    dev = torch.device(device) if device is not None else output.device
    chunk = _chunk_frames(reference)
    return torch.cat([_ssim_chunk(reference[i:i + chunk].to(dev), output[i:i + chunk].to(dev)).cpu()
                      for i in range(0, len(reference), chunk)]).numpy()


def quality(ref_frames: torch.Tensor, ref_audio: torch.Tensor, frames: torch.Tensor, audio: torch.Tensor,
            device: torch.device | str | None = None, flip_frames: int = FLIP_FRAMES, fps: float | None = None,
            sample_rate: int | None = None) -> Quality:
    """PSNR, temporal PSNR, SSIM, FLIP, audio SNR and spectral distance of an output against the baseline,
    in one pass over chunks of frames on ``device`` (default: where ``frames`` lives; in a trial the
    pipeline's device, where the decode left them and where the worker keeps the baseline's). PSNR and
    temporal PSNR are exact (integer sums) on any device; SSIM is scikit-image's, from ``_ssim_chunk`` on a
    CUDA device (equal to 1e-9) and from scikit-image itself on the CPU, where it is the faster of the two.
    FLIP runs over ``flip_frames`` frames (0: left out), on a CUDA device where the frames are, else on the
    host. Only per-frame numbers (and on the CPU path the FLIP frames) leave the device. The audio-video
    offset needs ``fps`` and ``sample_rate`` (None without them)."""
    _check_frames(ref_frames, frames)
    dev = torch.device(device) if device is not None else frames.device
    on_gpu = dev.type == "cuda"
    if on_gpu:
        _check_ssim_size(ref_frames)
    chunk = _chunk_frames(ref_frames)
    sse, tsse, ssim, previous, thumbs = [], [], [], None, ([], [])
    for i in range(0, len(ref_frames), chunk):
        x, y = ref_frames[i:i + chunk].to(dev), frames[i:i + chunk].to(dev)
        d = y.to(torch.int16) - x.to(torch.int16)
        sse.append(_sum_squares(d).cpu())
        tsse.append(_temporal_squared_errors(d, previous).cpu())
        previous = d[-1]
        thumbs[0].append(_thumbnails(x))
        thumbs[1].append(_thumbnails(y))
        if on_gpu:
            ssim.append(_ssim_chunk(x, y).cpu())
    sse_np = torch.cat(sse).numpy()
    psnr = _psnr_from_sse(sse_np, ref_frames[0].numel())
    tpsnr = _psnr_from_sse(torch.cat(tsse).numpy(), ref_frames[0].numel())
    picked = flip_frame_indices(psnr, flip_frames)
    flips = flip_per_frame(ref_frames, frames, [i for i in picked if sse_np[i] != 0], dev)
    flips += [0.0] * sum(1 for i in picked if sse_np[i] == 0)  # (an equal frame scores 0: not run)
    if on_gpu:
        ssim_np = torch.cat(ssim).numpy()
    else:
        from skimage.metrics import structural_similarity

        r, o = ref_frames.cpu().numpy(), frames.cpu().numpy()
        ssim_np = np.array([structural_similarity(r[i], o[i], channel_axis=-1, data_range=255) for i in range(len(r))])
    ref_audio, audio = ref_audio.cpu(), audio.cpu()
    identical = bool((sse_np == 0).all() and torch.equal(ref_audio, audio))
    return Quality(
        psnr_db=float(psnr.mean()),
        psnr_db_worst=float(psnr.min()),
        ssim=float(ssim_np.mean()),
        ssim_worst=float(ssim_np.min()),
        audio_snr_db=audio_snr_db(ref_audio, audio),
        identical=identical,
        temporal_psnr_db=float(tpsnr.mean()) if len(tpsnr) else PSNR_CAP_DB,
        temporal_psnr_db_worst=float(tpsnr.min()) if len(tpsnr) else PSNR_CAP_DB,
        flip=float(np.mean(flips)) if flips else None,
        flip_worst=float(np.max(flips)) if flips else None,
        flip_frames=tuple(picked),
        audio_spectral_db=audio_spectral_db(ref_audio, audio),
        audio_spectral_snr_db=audio_spectral_snr_db(ref_audio, audio),
        av_offset_ms=(None if fps is None or sample_rate is None else
                      _av_offset(torch.cat(thumbs[0]), torch.cat(thumbs[1]), ref_audio, audio, fps, sample_rate)),
    )
