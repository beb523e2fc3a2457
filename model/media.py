"""Writing and reading generated media: MP4 (H.264 + AAC, PyAV) and raw safetensors.

Quality is always measured on the raw uint8 frames of the safetensors file, never on the MP4: the MP4
is for people (re-encoding noise-like frames alone costs ~15 dB, docs/environment.md).
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch

from vidtune._io import atomic_path

__all__ = ["write_mp4", "write_raw", "read_raw", "probe_mp4"]


def write_mp4(path: Path, frames: torch.Tensor, fps: float, audio: torch.Tensor | None, sample_rate: int,
              crf: int = 18) -> Path:
    """Write uint8 frames [F, H, W, 3] and float audio [C, N] in [-1, 1] as an MP4 with an AAC track."""
    import av

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frames_np = frames.contiguous().cpu().numpy()
    if frames_np.dtype != np.uint8 or frames_np.ndim != 4 or frames_np.shape[-1] != 3:
        raise ValueError(f"frames must be uint8 [F, H, W, 3], got {frames_np.dtype} {frames_np.shape}")
    rate = Fraction(fps).limit_denominator(1001)
    with atomic_path(path) as tmp:  # (a kill or a full disk mid-write leaves no partial MP4)
        _encode_mp4(av, tmp, frames_np, rate, crf, audio, sample_rate)
    return path


def _encode_mp4(av: Any, path: Path, frames_np: np.ndarray, rate: Fraction, crf: int, audio: torch.Tensor | None,
                sample_rate: int) -> None:
    with av.open(str(path), mode="w") as container:
        vstream = container.add_stream("libx264", rate=rate)
        vstream.width, vstream.height = frames_np.shape[2], frames_np.shape[1]
        vstream.pix_fmt = "yuv420p"
        vstream.options = {"crf": str(crf)}
        astream = None
        if audio is not None:
            astream = container.add_stream("aac", rate=sample_rate)
            astream.layout = "stereo" if audio.shape[0] == 2 else "mono"
        for i, img in enumerate(frames_np):
            vf = av.VideoFrame.from_ndarray(img, format="rgb24")
            vf.pts = i
            for packet in vstream.encode(vf):
                container.mux(packet)
        for packet in vstream.encode():
            container.mux(packet)
        if astream is not None:
            samples = audio.detach().float().clamp(-1, 1).cpu().numpy().astype(np.float32)
            af = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples), format="fltp", layout=astream.layout.name)
            af.sample_rate = sample_rate
            af.pts = 0
            for packet in astream.encode(af):
                container.mux(packet)
            for packet in astream.encode():
                container.mux(packet)


def write_raw(path: Path, frames: torch.Tensor, audio: torch.Tensor, sample_rate: int, fps: float) -> Path:
    """Write the exact frames (uint8) and audio (float32) as safetensors, for quality measurement."""
    path = Path(path)
    with atomic_path(path) as tmp:
        safetensors.torch.save_file(
            {"frames": frames.contiguous().cpu(), "audio": audio.float().contiguous().cpu()},
            str(tmp),
            metadata={"sample_rate": str(sample_rate), "fps": repr(float(fps))},
        )
    return path


def read_raw(path: Path) -> tuple[torch.Tensor, torch.Tensor, int, float]:
    """Read ``write_raw``'s file: (frames, audio, sample_rate, fps)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        frames, audio = f.get_tensor("frames"), f.get_tensor("audio")
    return frames, audio, int(meta.get("sample_rate", 0)), float(meta.get("fps", 0))


def probe_mp4(path: Path) -> dict:
    """Open an MP4 with PyAV and count what is really in it (decoded frames, audio stream facts)."""
    import av

    with av.open(str(path)) as container:
        video = container.streams.video[0]
        audio_streams = list(container.streams.audio)
        info = {
            "width": video.codec_context.width,
            "height": video.codec_context.height,
            "video_codec": video.codec_context.name,
            "audio_streams": len(audio_streams),
            "audio_codec": audio_streams[0].codec_context.name if audio_streams else None,
            "audio_rate": audio_streams[0].codec_context.sample_rate if audio_streams else None,
        }
        info["frames"] = sum(1 for _ in container.decode(video=0))
    return info
