"""The baseline run (every knob off), stored under ``results/<name>/baseline/`` and reused by key.

A baseline is valid only for the exact model, request, library versions, device and pipeline settings
that made it; its key is the sha256 of the sorted JSON of all of these (docs/conventions.md: cache keys), so a stale
baseline is never compared against.
"""

from __future__ import annotations

import hashlib
import json
import platform
import threading
import warnings
from dataclasses import dataclass, field, fields
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from vidtune.model.loading import ModelSource
from vidtune.model.media import read_raw, write_mp4, write_raw
from vidtune.model.request import GenerationRequest
from vidtune.search.stages import StoredStages

if TYPE_CHECKING:
    from vidtune.model.pipeline import ReferencePipeline  # (annotations: the pipeline module imports ltx-pipelines)

__all__ = ["Baseline", "baseline_key", "damage", "environment", "load_baseline", "package_version", "save_baseline"]


def package_version(dist: str) -> str:
    """An installed distribution's version, "absent" where it is not installed."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def environment(device: torch.device) -> dict[str, Any]:
    """What produced a number: device name, torch/CUDA, ltx-core/ltx-pipelines/vidtune versions."""
    import vidtune

    device = torch.device(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({platform.machine()})"
    return {
        "device": name,
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda,
        "ltx_core": package_version("ltx-core"),
        "ltx_pipelines": package_version("ltx-pipelines"),
        "vidtune": vidtune.__version__,
        "python": platform.python_version(),
    }


def _pipeline_settings(pipeline: ReferencePipeline) -> dict[str, Any]:
    vae = pipeline.vae_tiling
    return {
        "stage2_tiling": repr(pipeline.stage2_tiling),
        "vae_tiling": repr(vae) if vae is not None else None,
    }


def baseline_key(source: ModelSource, request: GenerationRequest, pipeline: ReferencePipeline) -> str:
    """sha256 of sorted JSON of model identity, request, environment and pipeline settings."""
    payload = {
        "model": source.identity(),
        "request": request.to_dict(),
        "environment": {k: v for k, v in environment(pipeline.device).items() if k != "python"},
        "pipeline": _pipeline_settings(pipeline),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


@dataclass
class Baseline:
    """A stored all-knobs-off run: media, stage outputs for restarting, and measured latency."""

    key: str
    directory: Path
    frames: torch.Tensor  # uint8 [F, H, W, 3], on the worker's device
    audio: torch.Tensor
    sample_rate: int
    stages: StoredStages
    latency: dict[str, Any] = field(default_factory=dict)  # stage -> LatencySummary dict
    meta: dict[str, Any] = field(default_factory=dict)
    writer: threading.Thread | None = field(default=None, repr=False)  # the MP4 being written (background)
    write_error: list[BaseException] = field(default_factory=list, repr=False)

    def wait_files(self, timeout: float | None = None) -> bool:
        """Wait until the files are on disk (True), or ``timeout`` passed (False); a write that failed raises."""
        if self.writer is not None:
            self.writer.join(timeout)
            if self.writer.is_alive():
                return False
        if self.write_error:
            raise RuntimeError(f"baseline {self.directory}: writing its files failed: {self.write_error[0]!r}")
        return True


def save_baseline(directory: Path, key: str, request: GenerationRequest, source: ModelSource,
                  pipeline: ReferencePipeline, frames: torch.Tensor, audio: torch.Tensor, sample_rate: int,
                  stages: StoredStages, latency: dict[str, Any], extra: dict[str, Any] | None = None,
                  mp4: bool = True, background: bool = False) -> Baseline:
    """Write ``output.safetensors`` (raw uint8 frames and the audio), ``stages.safetensors``, ``video.mp4``
    (``mp4=False``: left out) and ``meta.json``.

    ``meta.json`` is written last (atomically), so a half-written baseline is never picked up; it records
    the size and sha256 of the two files a reuse reads (``load_baseline`` checks them). Those are written
    before this returns (after the timed runs: off the timed path), since another process (a replaced
    actor, a helper rank) may need them at once; with ``background=True`` the MP4, which no process reads
    and which takes the longest (an H.264 encode), is written by a thread while the caller goes on,
    ``Baseline.wait_files`` waits for it. The frames are stored once, as raw uint8 (no float copy): the
    reference a reuse compares with must be exact, which rules out a lossy codec, and the frames of random
    weights do not compress.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    host_frames, host_audio = frames.contiguous().cpu(), audio.contiguous().cpu()
    host_stages = StoredStages(**{f.name: getattr(stages, f.name).contiguous().cpu() for f in fields(stages)})
    meta = {
        "key": key,
        "request": request.to_dict(),
        "model": source.identity(),
        "environment": environment(pipeline.device),
        "pipeline": _pipeline_settings(pipeline),
        "latency": latency,
        **(extra or {}),
    }
    base = Baseline(key, directory, frames, audio, sample_rate, stages, latency, meta)
    write_raw(directory / "output.safetensors", host_frames, host_audio, sample_rate, request.fps)
    host_stages.save(directory / "stages.safetensors")
    meta["files"] = {name: _fingerprint(directory / name) for name in _CHECKED}
    _write_meta(directory, meta)

    def write_video() -> None:
        try:  # under another name until whole: a process killed mid-encode leaves no torn MP4
            tmp = write_mp4(directory / "video.tmp.mp4", host_frames, request.fps, host_audio, sample_rate)
            Path(tmp).replace(directory / "video.mp4")
        except BaseException as exc:  # reported by wait_files; the baseline itself is whole
            base.write_error.append(exc)

    if mp4 and background:
        base.writer = threading.Thread(target=write_video, name=f"baseline-mp4-{key[:8]}", daemon=False)
        base.writer.start()
    elif mp4:
        write_video()
        base.wait_files()
    return base


_CHECKED = ("output.safetensors", "stages.safetensors")


def _fingerprint(path: Path) -> dict[str, Any]:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            digest.update(chunk)
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def _write_meta(directory: Path, meta: dict[str, Any]) -> None:
    tmp = directory / "meta.json.tmp"
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True))
    tmp.replace(directory / "meta.json")


def damage(directory: Path, meta: dict[str, Any]) -> str | None:
    """What is wrong with a stored baseline's files against the sizes and digests its meta recorded (None:
    whole; a baseline stored before the digests were recorded is taken as whole)."""
    for name, want in (meta.get("files") or {}).items():
        path = Path(directory) / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != want["bytes"]:
            return f"{name} has {path.stat().st_size} bytes, {want['bytes']} were stored"
        if _fingerprint(path)["sha256"] != want["sha256"]:
            return f"{name} does not match the sha256 recorded when it was stored"
    return None


def load_baseline(directory: Path, key: str, device: torch.device) -> Baseline | None:
    """The baseline stored in ``directory`` if its key is ``key``; None otherwise."""
    directory = Path(directory)
    meta_path = directory / "meta.json"
    if not meta_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_text())
    except ValueError:
        warnings.warn(f"baseline {directory}: meta.json is not JSON; computing the baseline again", stacklevel=2)
        return None
    if meta.get("key") != key:
        return None
    wrong = damage(directory, meta)
    if wrong:  # (a truncated baseline was reused by its key and crashed the run)
        warnings.warn(f"baseline {directory}: {wrong}; computing the baseline again", stacklevel=2)
        return None
    frames, audio, sample_rate, _ = read_raw(directory / "output.safetensors")
    frames = frames.to(device)  # kept on the worker's device, where the trials' frames are compared with it
    stages = StoredStages.load(directory / "stages.safetensors", torch.device(device))
    return Baseline(key, directory, frames, audio, sample_rate, stages, meta.get("latency", {}), meta)
