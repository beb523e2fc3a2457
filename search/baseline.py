"""The baseline run (every knob off), stored under ``results/<name>/baseline/`` and reused by key.

A baseline is valid only for the exact model, request, library versions, device and pipeline settings
that made it; its key is the sha256 of the sorted JSON of all of these (STYLE.md point 6), so a stale
baseline is never compared against.
"""

from __future__ import annotations

import hashlib
import json
import platform
import warnings
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from vidtune.model.loading import ModelSource
from vidtune.model.media import read_raw, write_mp4, write_raw
from vidtune.model.pipeline import ReferencePipeline
from vidtune.model.request import GenerationRequest
from vidtune.search.stages import StoredStages

__all__ = ["Baseline", "baseline_key", "damage", "environment", "load_baseline", "save_baseline", "update_baseline_meta"]


def _version(dist: str) -> str:
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
        "ltx_core": _version("ltx-core"),
        "ltx_pipelines": _version("ltx-pipelines"),
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
    frames: torch.Tensor
    audio: torch.Tensor
    sample_rate: int
    stages: StoredStages
    latency: dict[str, Any] = field(default_factory=dict)  # stage -> LatencySummary dict
    meta: dict[str, Any] = field(default_factory=dict)


def save_baseline(directory: Path, key: str, request: GenerationRequest, source: ModelSource,
                  pipeline: ReferencePipeline, frames: torch.Tensor, audio: torch.Tensor, sample_rate: int,
                  stages: StoredStages, latency: dict[str, Any], extra: dict[str, Any] | None = None) -> Baseline:
    """Write ``video.mp4``, ``output.safetensors``, ``stages.safetensors`` and ``meta.json``.

    ``meta.json`` is written last (atomically), so a half-written baseline is never picked up; it records
    the size and sha256 of the two files a reuse reads (``load_baseline`` checks them).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_raw(directory / "output.safetensors", frames, audio, sample_rate, request.fps)
    write_mp4(directory / "video.mp4", frames, request.fps, audio, sample_rate)
    stages.save(directory / "stages.safetensors")
    meta = {
        "files": {name: _fingerprint(directory / name) for name in _CHECKED},
        "key": key,
        "request": request.to_dict(),
        "model": source.identity(),
        "environment": environment(pipeline.device),
        "pipeline": _pipeline_settings(pipeline),
        "latency": latency,
        **(extra or {}),
    }
    _write_meta(directory, meta)
    return Baseline(key, directory, frames, audio, sample_rate, stages, latency, meta)


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


def update_baseline_meta(base: Baseline, extra: dict[str, Any]) -> Baseline:
    """Add ``extra`` to a stored baseline's ``meta.json`` only (the noise floor, measured after the save):
    the frames, stages and MP4 are not written again (at 3840x2176 they are 3.7 GB)."""
    base.meta.update(extra)
    _write_meta(Path(base.directory), base.meta)
    return base


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
    stages = StoredStages.load(directory / "stages.safetensors", torch.device(device))
    return Baseline(key, directory, frames, audio, sample_rate, stages, meta.get("latency", {}), meta)
